"""Small DDP MLP on gloo with injectable bottlenecks, for the findings tests.

Run under `gpudiag trace --nproc-per-node N`. Options:
  --slow-rank R --slow-ms M   rank R sleeps M ms inside forward every step (straggler)
  --data-ms M                 the Dataset sleeps M ms per batch (slow DataLoader)
  --width W --depth D --batch B --steps N   model and batch size
"""

import argparse
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
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    sleep_s = args.slow_ms / 1000 if rank == args.slow_rank else 0.0
    model = DDP(Net(args.width, args.depth, sleep_s))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = BatchDataset(args.steps * dist.get_world_size(), args.width, args.batch, args.data_ms)
    loader = DataLoader(data, batch_size=None, sampler=DistributedSampler(data, shuffle=False))
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
