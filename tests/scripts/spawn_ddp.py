"""The tutorial shape of a DDP script that starts its own workers with
torch.multiprocessing.spawn (no torchrun, no gpudiag code). Traced by
tests/test_reliability_gloo.py as `gpudiag trace spawn_ddp.py [STEPS] [SLOW_RANK] [SLEEP_S]`."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("SPAWN_TEST_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size, steps, slow_rank, sleep_s):
    setup(rank, world_size)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    for _ in range(steps):
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 10))
        if rank == slow_rank:
            time.sleep(sleep_s)
        loss_fn(outputs, torch.randn(20, 5)).backward()
        optimizer.step()
    cleanup()


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    sleep_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    world_size = 2
    mp.spawn(demo_basic, args=(world_size, steps, slow_rank, sleep_s), nprocs=world_size, join=True)
