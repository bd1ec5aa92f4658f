"""A 2-rank gloo DDP job started once per rank by hand (tests/test_separate_desync.py).

`python separate_desync_job.py RANK` with MASTER_ADDR / MASTER_PORT set: init_method
tcp://, rank= and world_size=2 passed to init_process_group. At step 3 rank 1
all-reduces 1000 floats where rank 0 reduces 1 (a collective size mismatch: gloo aborts
one rank, the other loses the connection).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    rank = int(sys.argv[1])
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(torch.ones(1))  # the same small call every step, every rank
        if step == 3:
            dist.all_reduce(torch.ones(1000 if rank == 1 else 1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
