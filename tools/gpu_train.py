"""Tiny GPU training job for tools/gpu_validate.sh (not a benchmark).

--mode single            one process on cuda:0
--mode ddp --backend B   DDP under torchrun; every rank on cuda:(local_rank % GPUs),
                         so 2 gloo ranks share one GPU
--mode dp                nn.DataParallel with device_ids=[0, 0]: two replicas on one
                         GPU (real scatter/replicate/gather). Prints DP_REJECTED and
                         exits 3 if torch refuses it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

WIDTH = 512


def model_and_data(steps: int, batch: int) -> tuple[torch.nn.Module, DataLoader]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10),
    )
    data = TensorDataset(torch.randn(steps * batch, WIDTH), torch.randint(0, 10, (steps * batch,)))
    return model, DataLoader(data, batch_size=batch, pin_memory=True)


def train(model: torch.nn.Module, loader: DataLoader, device: torch.device) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("single", "ddp", "dp"), required=True)
    p.add_argument("--backend", default="nccl")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("NO_CUDA: torch.cuda.is_available() is False", flush=True)
        return 4
    model, loader = model_and_data(args.steps, args.batch)
    if args.mode == "single":
        device = torch.device("cuda:0")
        train(model.to(device), loader, device)
    elif args.mode == "ddp":
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        device = torch.device(f"cuda:{local}")
        torch.cuda.set_device(device)
        dist.init_process_group(args.backend)
        ddp = torch.nn.parallel.DistributedDataParallel(model.to(device), device_ids=[local])
        train(ddp, loader, device)
        dist.destroy_process_group()
    else:
        device = torch.device("cuda:0")
        try:
            dp = torch.nn.DataParallel(model.to(device), device_ids=[0, 0])
            dp(torch.randn(4, WIDTH, device=device)).sum().backward()
        except Exception as exc:
            print(f"DP_REJECTED {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            return 3
        train(dp, loader, device)
    print(f"GPU_TRAIN_DONE mode={args.mode} steps={args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
