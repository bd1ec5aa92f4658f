"""score_sde-style step functions: one factory makes the training and the evaluation step."""

import torch


def optimization_manager(config):
    def optimize_fn(optimizer, params, step, lr=config.lr, grad_clip=config.grad_clip):
        if grad_clip >= 0:
            torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip)
        optimizer.step()

    return optimize_fn


def get_sde_loss_fn(sde, train, eps=1e-5):
    def loss_fn(model, batch):
        t = torch.rand(batch.shape[0], device=batch.device) * (sde.T - eps) + eps
        z = torch.randn_like(batch)
        score = model(batch + sde.std(t)[:, None] * z, t)
        return torch.mean(torch.square(score * sde.std(t)[:, None] + z))

    return loss_fn


def get_step_fn(sde, train, optimize_fn=None):
    loss_fn = get_sde_loss_fn(sde, train)

    def step_fn(state, batch):
        model = state["model"]
        if train:
            optimizer = state["optimizer"]
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimize_fn(optimizer, model.parameters(), step=state["step"])
            state["step"] += 1
        else:
            with torch.no_grad():
                loss = loss_fn(model, batch)
        return loss

    return step_fn
