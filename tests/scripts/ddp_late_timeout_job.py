"""A 2-rank gloo DDP job whose process group times out after --timeout-s: rank 1 spends
--late-s in its own code (a slow checkpoint write) before step --late-at, so rank 0 times
out in a collective torch issues itself, not the script: DDP's gradient bucket
all_reduce inside backward (--where backward), or DDP's start-up sync of the module's
parameters (--where init, rank 1 late to `DDP(...)`) (issue 28, probe 28g N5)."""

import argparse
import datetime
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--timeout-s", type=float, default=3.0)
p.add_argument("--late-at", type=int, default=2)
p.add_argument("--late-s", type=float, default=60.0)
p.add_argument("--where", choices=("backward", "init"), default="backward")
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
rank = dist.get_rank()
torch.manual_seed(0)
if rank == 1 and args.where == "init":
    time.sleep(args.late_s)  # LATE HERE (init)
model = DDP(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    if rank == 1 and step == args.late_at and args.where == "backward":
        time.sleep(args.late_s)  # LATE HERE (backward)
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
dist.destroy_process_group()
