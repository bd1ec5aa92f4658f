"""Small DDP MLP on gloo for gpudiag's capture tests and bench/overhead.py.

Runs under torchrun (or `gpudiag trace --nproc-per-node N`). Options:
  --steps N            training steps (default 12)
  --crash-rank R --crash-step S   rank R raises RuntimeError at step S
  --hang-rank R --hang-step S     rank R sleeps for an hour at step S (others block in DDP)
  --sleep S            seconds to sleep in every step (lets a test signal the job mid-run)
  --times FILE         append this rank's per-step wall times (ms) as one JSON line
  --width W --depth D  MLP size
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--times", default=None)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    return p.parse_args()


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data))
    times = []
    cpu_times = []  # process CPU time per step: far less disturbed by other load than wall
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for step, (x, y) in enumerate(loader):
        t0 = time.perf_counter()
        c0 = time.process_time()
        if rank == args.crash_rank and step == args.crash_step:
            raise RuntimeError(f"injected crash on rank {rank} at step {step}")
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(3600)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu_times.append((time.process_time() - c0) * 1e3)
    if args.times:
        with open(args.times, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "rank": rank,
                        "pid": os.getpid(),
                        "grad_bytes": grad_bytes,
                        "steps": len(times),
                        "ms": times,
                        "cpu_ms": cpu_times,
                    }
                )
                + "\n"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
