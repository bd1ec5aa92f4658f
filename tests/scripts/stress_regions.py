"""Region-using, hook-heavy training for the profiler-safety stress (issue 28).

Every step (the batch fetch included) runs inside ``gpudiag.region`` and a user
``record_function``, with user forward/backward hooks on every module, so the profiler
window opens and closes while user ranges and hooks are active. Options add DDP (run it under --nproc-per-node 2),
DataLoader worker processes, CPU autocast and torch.compile. Exits 0 after --steps.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader, TensorDataset

import gpudiag

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=14)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--amp", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--no-loader", action="store_true", help="tensors, no DataLoader")
args = p.parse_args()

distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
    torch.nn.Linear(64, 4),
)  # fmt: skip
seen: list[int] = []
for module in model.modules():
    module.register_forward_hook(lambda m, i, o: seen.append(1))
    module.register_full_backward_hook(lambda m, gi, go: None)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
if args.compile:
    model = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(args.steps * 8, 32), torch.randint(0, 4, (args.steps * 8,)))
if args.no_loader:
    batches = iter(
        [(data.tensors[0][i : i + 8], data.tensors[1][i : i + 8]) for i in range(0, len(data), 8)]
    )
else:
    batches = iter(DataLoader(data, batch_size=8, num_workers=args.workers))
for _ in range(args.steps):
    # the batch is fetched inside the ranges: the window's stop and start points (the
    # DataLoader's __next__, or the first forward) fall inside open user ranges
    with gpudiag.region("step"), record_function("user_step"):
        x, y = next(batches)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with gpudiag.region("backward"):
            loss.backward()
        opt.step()
        seen.clear()
if distributed:
    dist.destroy_process_group()
print("STRESS DONE", flush=True)
