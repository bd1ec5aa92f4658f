"""A tensor scaled in place (`grad_norm /= world_size`) is still a tensor: testing it in
`if` asks the GPU for its value, like `.item()`. A Python counter updated the same way is
not (the control)."""

import torch
import torch.distributed as dist


def train(model, loader, optimizer, world_size):
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    skipped = 0
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        grad_norm /= world_size
        if grad_norm > 100.0:  # expect: GD301
            skipped += 1
            optimizer.zero_grad()
            continue
        skipped *= 1
        if skipped > 10:
            break
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
