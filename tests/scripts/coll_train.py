"""A plain 2-rank DDP training script (no gpudiag code), traced by test_collectives_trace.py.

Usage: coll_train.py STEPS [hang]. With ``hang``, rank 1 stops calling all_reduce after
the training steps (sleeps) while rank 0 waits in one.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    steps = int(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)),
        bucket_cap_mb=0.1,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(16, 128)).sum().backward()
        opt.step()
        opt.zero_grad()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    if len(sys.argv) > 2 and sys.argv[2] == "hang":
        if rank == 1:
            time.sleep(300)
        dist.all_reduce(torch.ones(256))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
