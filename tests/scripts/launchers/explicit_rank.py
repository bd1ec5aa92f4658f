"""A DDP script started once per rank by hand, each start passing its own rank to
init_process_group (no torchrun, no RANK in the environment):
`MASTER_ADDR=127.0.0.1 MASTER_PORT=P python explicit_rank.py RANK [WORLD] [STEPS]`.
Traced by tests/test_launchers.py, one `gpudiag trace` per rank."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    rank = int(sys.argv[1])
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 32)).square().mean().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
