"""Correct rooted collectives and an all-to-all with uneven splits (their ranks pass other
sizes by design), then, with --fail, rank 1 raises (its own error is the cause)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
dist.scatter(x, [torch.ones(4)] * world if rank == 0 else None, src=0)
out = [None]
dist.scatter_object_list(out, list(range(world)) if rank == 0 else None, src=0)
dist.gather(x, [torch.ones(4) for _ in range(world)] if rank == 0 else None, dst=0)
dist.all_reduce(x)
if "--fail" in sys.argv and rank == 1:
    raise ValueError("the real cause, on rank 1")  # RAISES HERE
dist.all_reduce(x)
dist.destroy_process_group()
