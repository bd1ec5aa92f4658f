import torch as th
from logger import logkv_mean, profile_kv, record_grad_norm


def train(model, opt, loader):
    for obs, ret in loader:
        with profile_kv("step"):
            with th.autocast("cuda", dtype=th.bfloat16):
                loss = (
                    (model(obs.cuda(non_blocking=True)) - ret.cuda(non_blocking=True)).pow(2).mean()
                )
            opt.zero_grad()
            loss.backward()
            record_grad_norm(model, check=False)
            opt.step()
        with profile_kv("log", sync_cuda=False):
            logkv_mean("loss", loss.detach(), to_host=True)


def main(loader):
    model = th.nn.Linear(64, 1).cuda()
    train(model, th.optim.Adam(model.parameters()), loader)
