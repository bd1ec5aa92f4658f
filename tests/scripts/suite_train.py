"""DDP MLP on gloo with one injectable problem each, for the labelled findings suite
(bench/findings_suite.py) and the slow findings regression tests.

Run under `gpudiag trace --nproc-per-node N`. Every delay is a sleep of M ms per step
on the ranks given (``all`` = every rank, a symmetric job):
  --fwd-ms M  --fwd-ranks R,..    inside forward (a rank that computes slower)
  --data-ms M --data-ranks R,..   in the DataLoader's collate_fn (a slow input pipeline)
  --opt-ms M  --opt-ranks R,..    after backward, before the optimizer step
  --fail-rank R --fail-step K     rank R raises at step K
  --hang-rank R --hang-step K     rank R stops calling collectives at step K (sleeps)
  --item                          loss.item() every step (a host sync on CUDA)
  --width W --depth D --batch B --steps N   model and batch size
  --bucket-cap-mb M               DDP's bucket_cap_mb (default: DDP's, 25)
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def _ranks(text: str, world: int) -> set[int]:
    if text == "all":
        return set(range(world))
    return {int(r) for r in text.split(",") if r.strip()}


class BatchDataset(Dataset):
    """Item i is the whole batch i (cheap to load)."""

    def __init__(self, n_batches: int, width: int, batch: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n_batches, batch, width, generator=g)
        self.y = torch.randn(n_batches, batch, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class SleepyCollate:
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __call__(self, items):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return items[0]


class Net(torch.nn.Module):
    def __init__(self, width: int, depth: int, sleep_s: float) -> None:
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    for what in ("fwd", "data", "opt"):
        p.add_argument(f"--{what}-ms", type=float, default=0.0)
        p.add_argument(f"--{what}-ranks", default="all")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--item", action="store_true")
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    def delay(what: str) -> float:
        on = rank in _ranks(getattr(args, f"{what}_ranks"), world)
        return getattr(args, f"{what}_ms") / 1000 if on else 0.0

    caps = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    model = DDP(Net(args.width, args.depth, delay("fwd")), **caps)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    data = BatchDataset(args.steps * world, args.width, args.batch)
    loader = DataLoader(
        data,
        batch_size=1,
        sampler=DistributedSampler(data, shuffle=False),
        collate_fn=SleepyCollate(delay("data")),
    )
    opt_sleep = delay("opt")
    for step, (x, y) in enumerate(loader):
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(600)  # never reaches the collectives of this step
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if opt_sleep:
            time.sleep(opt_sleep)
        opt.step()
        if args.item:
            loss.item()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
