"""Small DDP MLP on gloo with injectable bottlenecks, for the findings tests.

Run under `gpudiag trace --nproc-per-node N`. Options:
  --slow-rank R --slow-ms M   rank R sleeps M ms inside forward every step (straggler)
  --data-ms M                 the Dataset sleeps M ms per batch (slow DataLoader)
  --data-rank R               ... on rank R only (default: every rank)
  --width W --depth D --batch B --steps N   model and batch size
  --no-ddp --last-step-sync   no DDP: each rank trains alone; in the last step every rank
                              all-reduces its loss once (--slow-rank sleeps --slow-ms
                              before that call only)
  --starve-rank R             rank R starts 3 processes spinning on its CPU (with --pin:
                              on CPU R, beside it): other processes starve it of CPU
  --pin                       rank R runs on CPU R only (a test starves one rank by
                              pinning CPU-hogging processes to its CPU)
"""

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class BatchDataset(Dataset):
    """Item i is the whole batch i (cheap to load), optionally after a sleep."""

    def __init__(self, n_batches: int, width: int, batch: int, data_ms: float) -> None:
        self.x = torch.randn(n_batches, batch, width)
        self.y = torch.randn(n_batches, batch, 1)
        self.sleep_s = data_ms / 1000

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


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
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--data-ms", type=float, default=0.0)
    p.add_argument("--data-rank", type=int, default=-1)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--starve-rank", type=int, default=-1)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    hogs = _start_hogs(3) if rank == args.starve_rank else []
    torch.manual_seed(0)
    torch.set_num_threads(1)
    sleep_s = args.slow_ms / 1000 if rank == args.slow_rank else 0.0
    net = Net(args.width, args.depth, 0.0 if args.no_ddp else sleep_s)
    model = net if args.no_ddp else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data_ms = args.data_ms if args.data_rank in (-1, rank) else 0.0
    data = BatchDataset(args.steps * dist.get_world_size(), args.width, args.batch, data_ms)
    loader = DataLoader(data, batch_size=None, sampler=DistributedSampler(data, shuffle=False))
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if args.no_ddp and i == len(loader) - 1:  # one end-of-run collective
            time.sleep(sleep_s)
            dist.all_reduce(loss.detach())
        opt.step()
    for hog in hogs:
        hog.kill()
        hog.wait()
    dist.destroy_process_group()


def _start_hogs(count: int) -> list[subprocess.Popen]:
    """Processes spinning on this process's CPUs (same session: the scheduler shares the
    CPU between them and this rank) until this process ends or kills them."""
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    for hog in hogs:
        os.sched_setaffinity(hog.pid, os.sched_getaffinity(0))
    return hogs


if __name__ == "__main__":
    main()
