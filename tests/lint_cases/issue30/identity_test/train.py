# ddgan's q_sample (judge 19, F1): `is None`, `is not`, isinstance compare identities or
# types, never a tensor's value; no sync. A value comparison on the same tensor still is one.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def q_sample(x_start, noise=None, scale=None):
    if noise is None:
        noise = torch.randn_like(x_start)
    if scale is not None and isinstance(scale, torch.Tensor):
        noise = noise * scale
    if noise is x_start:
        noise = noise.clone()
    if noise.abs().max() > 10:  # expect: GD301
        noise = noise.clamp(-10, 10)
    return x_start + noise


def main():
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        x = torch.randn(4, 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(
                q_sample(x, noise=torch.randn_like(x), scale=torch.ones(1, device="cuda"))
            ).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
