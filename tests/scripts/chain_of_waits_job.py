"""3 ranks, a chain of waits: rank 2 is slow in its own code, rank 1 waits for it in
group B = [1, 2], rank 0 waits for rank 1 in group A = [0, 1]. With --timeout-s, group A
times out (rank 2 sleeps 15 s); without, the job hangs (rank 2 sleeps 120 s)."""

import argparse
import datetime
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--timeout-s", type=float, default=None)
args = p.parse_args()
limits = {}
if args.timeout_s is not None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    limits = {"timeout": datetime.timedelta(seconds=args.timeout_s)}
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
group_a = dist.new_group([0, 1], **limits)
group_b = dist.new_group([1, 2])
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
if rank == 2:
    time.sleep(15 if args.timeout_s is not None else 120)  # SLOW HERE
if rank in (1, 2):
    dist.all_reduce(x, group=group_b)
if rank in (0, 1):
    dist.all_reduce(x, group=group_a)
dist.barrier()
dist.destroy_process_group()
