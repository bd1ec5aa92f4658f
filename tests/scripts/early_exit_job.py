"""A 2-rank gloo DDP job whose rank 1 ends in MODE (tests/test_blame_early_exit.py).

`python early_exit_job.py MODE [STEPS] [RANK]`: under torchrun (RANK from the
environment), or started once per rank by hand with RANK given and MASTER_ADDR /
MASTER_PORT set (init_method tcp://, rank= and world_size= passed to init_process_group).

MODE: ok; sysexit0 / osexit0 (rank 1 leaves with exit code 0 after step 2); barrier
(rank 1 leaves at the end without the final dist.barrier() rank 0 waits in); raise (rank
1 raises after step 2); osexit3 (rank 1 dies with exit code 3, no status); late0 (rank 0
raises after step 2, rank 1 catches its peer error and exits 0 after it).
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    if len(sys.argv) > 3:
        address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("gloo", init_method=address, rank=int(sys.argv[3]), world_size=2)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(steps):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).square().mean().backward()
            optimizer.step()
            if step == 2 and rank == 1 and mode == "sysexit0":
                sys.exit(0)
            if step == 2 and rank == 1 and mode == "osexit0":
                os._exit(0)
            if step == 2 and rank == 1 and mode == "osexit3":
                os._exit(3)
            if step == 2 and rank == 1 and mode == "raise":
                raise ValueError("rank 1 fails on its own")
            if step == 2 and rank == 0 and mode == "late0":
                raise ValueError("rank 0 fails on its own")
    except RuntimeError:
        if mode == "late0":  # the peer error after rank 0 failed: leave quietly
            sys.exit(0)
        raise
    if mode == "barrier":
        if rank == 1:
            sys.exit(0)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
