# A tensor used as a bool in the step (DINO's clip_gradients): a host sync like .item().
import torch


def clip(model, max_norm):
    for p in model.parameters():
        clip_coef = max_norm / (p.grad.data.norm(2) + 1e-6)
        if clip_coef < 1:  # expect: GD301
            p.grad.data.mul_(clip_coef)


def train(model, loader, optimizer, max_norm):
    for x, _ in loader:
        with torch.autocast("cuda"):
            loss = model(x.cuda()).mean()
        loss.backward()
        norm_ratio = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) / max_norm
        if norm_ratio < 1:  # expect: GD301
            clip(model, max_norm)
        scale = max_norm * 2
        if scale > 1:
            optimizer.step()
