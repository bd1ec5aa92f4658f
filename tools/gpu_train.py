"""Tiny GPU training job for tools/gpu_validate.sh (not a benchmark).

--mode single            one process on cuda:0
--mode ddp --backend B   DDP under torchrun; every rank on cuda:(local_rank % GPUs),
                         so 2 gloo ranks share one GPU
--mode dp                nn.DataParallel with device_ids=[0, 0]: two replicas on one
                         GPU (real scatter/replicate/gather). Prints DP_REJECTED and
                         exits 3 if torch refuses it.
--amp bf16|fp16          autocast (fp16 with a GradScaler)
--synthetic              one batch made on the GPU, reused every step (no DataLoader):
                         for timing the capture overhead without input costs

Prints `TRAIN_MS_PER_STEP <ms> over <n> steps`: wall time of the steps after the first
--warmup, between two synchronizes (the host is not synchronized inside the loop).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

Batches = DataLoader | list[tuple[torch.Tensor, torch.Tensor]]


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


def make_data(args: argparse.Namespace) -> Batches:
    n, width = args.steps * args.batch, args.width
    if args.synthetic:
        x = torch.randn(args.batch, width, device="cuda")
        y = torch.randint(0, 10, (args.batch,), device="cuda")
        return [(x, y)] * args.steps
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    return DataLoader(data, batch_size=args.batch, pin_memory=True)


def train(model: torch.nn.Module, batches: Batches, device: torch.device, args) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")
    start, timed = 0.0, 0
    for i, (x, y) in enumerate(batches):
        if i == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        timed += i >= args.warmup
    torch.cuda.synchronize()
    if timed:
        ms = (time.perf_counter() - start) * 1000 / timed
        print(f"TRAIN_MS_PER_STEP {ms:.3f} over {timed} steps", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("single", "ddp", "dp"), required=True)
    p.add_argument("--backend", default="nccl")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off")
    p.add_argument("--synthetic", action="store_true")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of TRAIN_MS_PER_STEP")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("NO_CUDA: torch.cuda.is_available() is False", flush=True)
        return 4
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the amp runs compare to it
    model, loader = make_model(args.width), make_data(args)
    if args.mode == "single":
        device = torch.device("cuda:0")
        train(model.to(device), loader, device, args)
    elif args.mode == "ddp":
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        device = torch.device(f"cuda:{local}")
        torch.cuda.set_device(device)
        dist.init_process_group(args.backend)
        ddp = torch.nn.parallel.DistributedDataParallel(model.to(device), device_ids=[local])
        train(ddp, loader, device, args)
        dist.destroy_process_group()
    else:
        device = torch.device("cuda:0")
        try:
            dp = torch.nn.DataParallel(model.to(device), device_ids=[0, 0])
            dp(torch.randn(4, args.width, device=device)).sum().backward()
        except Exception as exc:
            print(f"DP_REJECTED {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            return 3
        train(dp, loader, device, args)
    print(f"GPU_TRAIN_DONE mode={args.mode} steps={args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
