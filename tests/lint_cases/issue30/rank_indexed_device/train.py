"""Eighteenth judge, GD403's message (NBFNet-PyG): `torch.device(cfg.gpus[get_rank()])`
indexes every device by the rank, and a "cuda" only compared (`if x.device.type ==
"cuda":`) places nothing: the finding says the tensors are on cuda:<rank>, the contexts on
GPU 0 (tests/test_lint_judge18.py checks the text)."""

import torch
import torch.distributed as dist
from torch import nn


def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def get_device(cfg):
    return torch.device(cfg.gpus[get_rank()])


def kernel(x):
    if x.device.type == "cuda":
        return x * 2
    return x


def main(cfg):
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    device = get_device(cfg)
    model = nn.Linear(4, 4).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device])  # expect: GD403
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = kernel(model(torch.randn(8, 4, device=device))).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None)
