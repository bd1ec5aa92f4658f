"""A gloo job whose process group times out after --timeout-s: rank --late-rank spends
--late-s in its own code (a slow checkpoint) before collective call --late-at, so the
other ranks time out waiting for it there (issue 28, the seventh round's class)."""

import argparse
import datetime
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--timeout-s", type=float, default=3.0)
p.add_argument("--late-rank", type=int, default=1)
p.add_argument("--late-at", type=int, default=5)
p.add_argument("--late-s", type=float, default=10.0)
p.add_argument(
    "--op", choices=("all_reduce", "monitored_barrier", "subgroup"), default="all_reduce"
)
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
rank = dist.get_rank()
t = torch.ones(10)
# --op subgroup: the calls go to a group of the last two ranks, whose first call the late
# rank never reaches (the other ranks wait at the end)
pair = [dist.get_world_size() - 2, dist.get_world_size() - 1]
timeout = datetime.timedelta(seconds=args.timeout_s)
group = dist.new_group(pair, timeout=timeout) if args.op == "subgroup" else None
for call in range(20):
    if rank == args.late_rank and call == args.late_at:
        time.sleep(args.late_s)  # LATE HERE
    if args.op == "monitored_barrier":  # it names the ranks that did not arrive
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=args.timeout_s))
    elif args.op == "subgroup":
        if rank in pair:
            dist.all_reduce(t, group=group)
    else:
        dist.all_reduce(t)
if args.op == "subgroup" and rank not in pair:
    time.sleep(2 * args.late_s)  # still in the job when the pair's call times out
dist.destroy_process_group()
