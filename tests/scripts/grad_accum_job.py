"""DDP on gloo that accumulates gradients over --accum micro-batches per optimizer step,
with model.no_sync() on the non-final ones when --no-sync is given (the right way), or
without it (an all-reduce every micro-step). Traced by tests/test_gradient_sync.py."""

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--accum", type=int, default=4)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--no-sync", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)
    ),
    bucket_cap_mb=0.5,
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(args.steps):
    opt.zero_grad()
    for micro in range(args.accum):
        last = micro == args.accum - 1
        sync = contextlib.nullcontext() if last or not args.no_sync else model.no_sync()
        with sync:
            x = torch.randn(32, 256)
            (model(x).square().mean() / args.accum).backward()
    opt.step()
dist.destroy_process_group()
