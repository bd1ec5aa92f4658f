"""PPO in the style of phasic-policy-gradient: the minibatch steps are a list comprehension."""

import torch as th
import torch.distributed as dist


def mpi_moments(x):
    stats = th.stack([x.sum(), (x**2).sum(), th.tensor(float(x.numel()), device=x.device)])
    dist.all_reduce(stats)
    total, sq, count = stats.tolist()  # once per iteration (advantage normalisation)
    mean = total / count
    return mean, (sq / count - mean**2) ** 0.5


def minibatch_gen(data, nminibatch):
    for chunk in th.chunk(th.randperm(data["obs"].shape[0], device=data["obs"].device), nminibatch):
        yield {key: value[chunk] for key, value in data.items()}


def make_train_fn(model, opt):
    def train_fn(obs, adv, ret):
        with th.autocast("cuda", dtype=th.bfloat16):
            loss = (model(obs).squeeze(-1) - ret).pow(2).mean() - adv.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    return train_fn


def minibatch_optimize(train_fn, data, nepoch, nminibatch):
    losses = []
    for _ in range(nepoch):
        losses += [train_fn(**mb) for mb in minibatch_gen(data, nminibatch)]
    return losses


def learn(model, opt, venv, n_iter, nminibatch=8):
    train_fn = make_train_fn(model, opt)
    for _ in range(n_iter):  # one PPO iteration: rollout, then many steps
        obs = venv.rollout().cuda()
        ret = model(obs).squeeze(-1).detach()
        adv = ret - ret.mean()
        mean, std = mpi_moments(adv)
        adv = (adv - mean) / (std + 1e-8)
        history = adv.cpu()  # once per iteration: GAE and the rollout buffer on the host
        venv.store(history)
        minibatch_optimize(train_fn, {"obs": obs, "adv": adv, "ret": ret}, 3, nminibatch)


def learn_logged(model, opt, venv, n_iter, nminibatch=8):
    train_fn = make_train_fn(model, opt)
    for _ in range(n_iter):
        obs = venv.rollout().cuda()
        ret = model(obs).squeeze(-1).detach()
        data = {"obs": obs, "adv": ret - ret.mean(), "ret": ret}
        # the step loop itself reads every step's loss to the host
        batches = minibatch_gen(data, nminibatch)
        logged = [train_fn(**mb)["loss"].item() for mb in batches]  # expect: GD301
        venv.log(sum(logged))


def main():
    dist.init_process_group("nccl")
    th.cuda.set_device(dist.get_rank() % th.cuda.device_count())
    model = th.nn.Linear(64, 1).cuda()
    opt = th.optim.Adam(model.parameters())
    learn(model, opt, venv=None, n_iter=1000)
    dist.destroy_process_group()


def learn_phases(model, opts, venv, n_iter, separate=False):
    """phasic-policy-gradient's own shape: nested train functions, one chosen per phase."""

    def train_with_opt(opt, obs, adv, ret):
        with th.autocast("cuda", dtype=th.bfloat16):
            loss = (model(obs).squeeze(-1) - ret).pow(2).mean() - adv.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    def train_pi(**arrays):
        return train_with_opt(opts["pi"], **arrays)

    def train_vf(**arrays):
        return train_with_opt(opts["vf"], **arrays)

    for _ in range(n_iter):
        obs = venv.rollout().cuda()
        ret = model(obs).squeeze(-1).detach()
        data = {"obs": obs, "adv": ret - ret.mean(), "ret": ret}
        venv.store(obs.cpu())  # once per iteration
        if separate:
            minibatch_optimize(train_vf, data, 1, 8)
            train_fn = train_pi
        else:
            train_fn = train_vf
        minibatch_optimize(train_fn, data, 3, 8)
