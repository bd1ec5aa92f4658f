"""A small gloo DDP job whose rank 0 prepares alone for SECONDS after init_process_group,
before DDP(model) (a download, preprocessing, a checkpoint read on rank 0 only): the
other ranks wait for it in DDP's start-up all_gather, once. Recorded into
tests/fixtures/startup_wait (the command is in tests/fixtures/README.md); read by
tests/test_startup_wait.py.

Usage: startup_wait_job.py SECONDS [STEPS]"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    seconds = float(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    dist.init_process_group("gloo")
    if int(os.environ["RANK"]) == 0:
        time.sleep(seconds)  # rank 0's own preparation
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
