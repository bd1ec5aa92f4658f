"""Reference trainer: one workload, trained single-device, with nn.DataParallel or with DDP.

    python -m gpudiag.reference --mode single --model mlp --steps 30
    python -m gpudiag.reference --mode ddp --spawn 2 --model toy            # mp.spawn, as in the article
    torchrun --nproc-per-node 2 -m gpudiag.reference --mode ddp            # or under torchrun
    gpudiag trace --nproc-per-node 2 -m gpudiag.reference --mode ddp       # or under capture

``--batch-size`` is PER RANK (per process): DDP on N ranks trains on a global batch of
N x batch-size; DataParallel feeds batch-size samples to each GPU (N x batch-size per
step); single-device trains on batch-size. Same seed gives the same initial weights on
every rank and a different shard of each global batch per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpudiag.reference.data import TeacherDataset, make_loader
from gpudiag.reference.models import WORKLOADS, ReferenceModel, build_model

EXIT_USAGE = 2
EVAL_SAMPLES = 512
PREFIX = "gpudiag.reference"


class UsageError(Exception):
    """A configuration this trainer refuses, with a one-line reason (exit status 2)."""


@dataclass
class StepRecord:
    step: int
    step_ms: float
    data_ms: float


@dataclass
class TrainReport:
    """What one rank did; written as JSON by ``--report-dir`` (one file per rank)."""

    mode: str
    model: str
    rank: int
    world_size: int
    device: str
    backend: str | None
    amp: bool
    batch_size: int
    global_batch: int
    steps: int
    initial_loss: float
    final_loss: float
    wall_s: float
    samples_per_s: float
    peak_memory_bytes: int
    peak_memory_kind: str
    step_records: list[StepRecord] = field(default_factory=list)
    ddp_logging: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpudiag.reference",
        description="Reference single / DataParallel / DDP trainer (batch size is per rank).",
    )
    p.add_argument("--mode", choices=("single", "dp", "ddp"), default="single")
    p.add_argument("--model", choices=sorted(WORKLOADS), default="toy")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda when available, else cpu",
    )
    p.add_argument(
        "--backend", default=None, help="DDP backend (default: nccl on cuda, gloo on cpu)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 20)")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="full passes over the dataset (--steps wins when both are given)",
    )
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--lr", type=float, default=None, help="SGD (momentum 0.9) learning rate; default per model"
    )
    p.add_argument(
        "--amp", action="store_true", help="autocast (fp16 + GradScaler on cuda, bf16 on cpu)"
    )
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP gradient bucket size")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--spawn",
        type=int,
        default=0,
        metavar="N",
        help="DDP: start N ranks with torch.multiprocessing.spawn",
    )
    p.add_argument(
        "--allow-cpu-fallback",
        action="store_true",
        help="--mode dp without CUDA: run single-device instead of refusing",
    )
    p.add_argument("--slow-rank", type=int, default=None, help="rank made slow in forward")
    p.add_argument("--slow-ms", type=float, default=0.0, help="sleep in that rank's forward")
    p.add_argument(
        "--slow-data-ms",
        type=float,
        default=0.0,
        help="sleep per batch in the DataLoader's collate (a slow input pipeline)",
    )
    p.add_argument(
        "--host-sync",
        action="store_true",
        help="loss.item() every step (a host-device sync on cuda)",
    )
    p.add_argument(
        "--report-dir",
        type=Path,
        default=None,
        help="write rank<R>.json with losses, step times and peak memory",
    )
    p.add_argument(
        "--save-params",
        type=Path,
        default=None,
        help="rank 0 saves the final state_dict here (torch.save)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.lr is None:
        args.lr = WORKLOADS[args.model].default_lr
    if args.steps is None and args.epochs is None:
        args.steps = 20
    for name in ("batch_size", "dataset_size", "steps", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch sees no CUDA device on this machine")
    return args


# --------------------------------------------------------------------------- helpers


def _log(rank: int, message: str) -> None:
    print(f"[{PREFIX} rank {rank}] {message}", flush=True)


def _under_gpudiag_capture() -> bool:
    """``gpudiag trace`` runs this module inside its capture worker, which ends the
    process itself once its files are flushed."""
    return any(name.startswith("gpudiag.capture") for name in sys.modules)


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    # ru_maxrss is KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process_max_rss"


def _unwrap(model: nn.Module) -> ReferenceModel:
    inner = (
        model.module
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel))
        else model
    )
    assert isinstance(inner, ReferenceModel)
    return inner


def _autocast(args: argparse.Namespace, device: torch.device) -> contextlib.AbstractContextManager:
    if not args.amp:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean squared error of the bare model on the held-out split, in fp32."""
    net = _unwrap(model).net
    return float(nn.functional.mse_loss(net(inputs), targets))


def slow_forward_s(args: argparse.Namespace, rank: int) -> float:
    """The injected forward delay of this rank: only --slow-rank sleeps."""
    return args.slow_ms / 1000 if args.slow_rank == rank else 0.0


def _step_budget(args: argparse.Namespace, batches_per_epoch: int) -> int:
    if args.steps is not None:
        return args.steps
    return args.epochs * batches_per_epoch


# --------------------------------------------------------------------------- training


@dataclass
class _RankData:
    """This rank's training data: the loader and its sampler, the global batch, and the
    held-out split the loss is evaluated on."""

    loader: Any
    sampler: Any
    global_batch: int
    eval_x: torch.Tensor
    eval_y: torch.Tensor


@dataclass
class _Optimization:
    """What one training step updates the model with."""

    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


def train(
    args: argparse.Namespace,
    *,
    rank: int = 0,
    world_size: int = 1,
    mode: str = "single",
    device_ids: list[int] | None = None,
) -> TrainReport:
    """Build model, data and optimizer for this rank and train. ``mode`` is the mode
    actually run (dp falls back to single when allowed)."""
    device = _rank_device(args)
    model, per_loader_batch = _wrapped_model(args, rank, mode, device, device_ids)
    data = _rank_data(args, per_loader_batch, rank, world_size, device)
    optimization = _Optimization(
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        scaler=torch.amp.GradScaler("cuda", enabled=args.amp and device.type == "cuda"),
    )
    total_steps = _step_budget(args, len(data.loader))
    initial_loss = evaluate(model, data.eval_x, data.eval_y)
    if rank == 0:
        _log(
            rank,
            f"mode={mode} model={args.model} world_size={world_size} device={device} "
            f"batch/rank={args.batch_size} global_batch={data.global_batch} "
            f"steps={total_steps} initial_loss={initial_loss:.5f}",
        )
    started = time.perf_counter()
    records = _train_steps(args, model, data, optimization, device, total_steps, rank)
    wall_s = _wall_s_since(started, device)
    final_loss = evaluate(model, data.eval_x, data.eval_y)
    peak, peak_kind = _peak_memory(device)
    report = TrainReport(
        mode=mode,
        model=args.model,
        rank=rank,
        world_size=world_size,
        device=str(device),
        backend=args.backend if mode == "ddp" else None,
        amp=args.amp,
        batch_size=args.batch_size,
        global_batch=data.global_batch,
        steps=len(records),
        initial_loss=initial_loss,
        final_loss=final_loss,
        wall_s=wall_s,
        samples_per_s=data.global_batch * len(records) / wall_s if wall_s > 0 else 0.0,
        peak_memory_bytes=peak,
        peak_memory_kind=peak_kind,
        step_records=records,
        ddp_logging=_ddp_logging(model) if mode == "ddp" else {},
    )
    _finish(args, model, report)
    return report


def _rank_device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        return torch.device(args.device, torch.cuda.current_device())
    return torch.device("cpu")


def _wrapped_model(
    args: argparse.Namespace,
    rank: int,
    mode: str,
    device: torch.device,
    device_ids: list[int] | None,
) -> tuple[nn.Module, int]:
    """(the model as ``mode`` trains it, the batch each DataLoader yields): DDP and
    single-device load a batch per rank, DataParallel one per GPU."""
    model: nn.Module = build_model(args.model, args.seed, slow_forward_s(args, rank)).to(device)
    if mode == "ddp":
        ddp_kwargs: dict[str, Any] = {}
        if args.bucket_cap_mb is not None:
            ddp_kwargs["bucket_cap_mb"] = args.bucket_cap_mb
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, **ddp_kwargs
        )
        return wrapped, args.batch_size
    if mode == "dp":
        per_loader_batch = args.batch_size * len(device_ids or [])
        return nn.DataParallel(model, device_ids=device_ids), per_loader_batch
    return model, args.batch_size


def _rank_data(
    args: argparse.Namespace,
    per_loader_batch: int,
    rank: int,
    world_size: int,
    device: torch.device,
) -> _RankData:
    workload = WORKLOADS[args.model]
    dataset = TeacherDataset(workload, args.dataset_size, args.seed)
    global_batch = per_loader_batch * world_size
    if global_batch > len(dataset):
        raise UsageError(
            f"global batch {global_batch} is larger than --dataset-size {len(dataset)}"
        )
    loader, sampler = make_loader(
        dataset,
        per_loader_batch,
        rank=rank,
        world_size=world_size,
        seed=args.seed,
        num_workers=args.num_workers,
        slow_data_s=args.slow_data_ms / 1000,
        pin_memory=device.type == "cuda",
    )
    held_out = TeacherDataset(workload, EVAL_SAMPLES, args.seed, split="eval")
    return _RankData(
        loader=loader,
        sampler=sampler,
        global_batch=global_batch,
        eval_x=held_out.inputs.to(device),
        eval_y=held_out.targets.to(device),
    )


def _train_steps(
    args: argparse.Namespace,
    model: nn.Module,
    data: _RankData,
    optimization: _Optimization,
    device: torch.device,
    total_steps: int,
    rank: int,
) -> list[StepRecord]:
    """``total_steps`` steps, epoch after epoch (each reshuffled by its sampler)."""
    records: list[StepRecord] = []
    epoch = 0
    while len(records) < total_steps:
        data.sampler.set_epoch(epoch)
        steps_before = len(records)
        _train_epoch(args, model, data, optimization, device, total_steps, rank, records)
        if len(records) == steps_before:
            raise UsageError("the DataLoader yielded no full batch; raise --dataset-size")
        epoch += 1
    return records


def _train_epoch(
    args: argparse.Namespace,
    model: nn.Module,
    data: _RankData,
    optimization: _Optimization,
    device: torch.device,
    total_steps: int,
    rank: int,
    records: list[StepRecord],
) -> None:
    """Steps over one pass of the loader, appended to ``records``, until the loader
    ends or ``total_steps`` are done."""
    batches = iter(data.loader)
    while len(records) < total_steps:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        t_data = time.perf_counter()
        _train_step(args, model, batch, optimization, device)
        t_end = time.perf_counter()
        record = StepRecord(len(records), (t_end - t0) * 1e3, (t_data - t0) * 1e3)
        records.append(record)
        if rank == 0 and not args.quiet:
            _log(
                rank,
                f"step {record.step:4d}  {record.step_ms:8.2f} ms  (data {record.data_ms:.2f} ms)",
            )


def _train_step(
    args: argparse.Namespace,
    model: nn.Module,
    batch: Any,
    optimization: _Optimization,
    device: torch.device,
) -> None:
    """One optimizer step on ``batch``: forward (under autocast with --amp), backward,
    step; with --host-sync, ``loss.item()`` after it."""
    inputs = batch[0].to(device, non_blocking=True)
    targets = batch[1].to(device, non_blocking=True)
    optimization.optimizer.zero_grad(set_to_none=True)
    with _autocast(args, device):
        loss = nn.functional.mse_loss(model(inputs).float(), targets)
    optimization.scaler.scale(loss).backward()
    optimization.scaler.step(optimization.optimizer)
    optimization.scaler.update()
    if args.host_sync:
        loss.item()


def _wall_s_since(started: float, device: torch.device) -> float:
    """Seconds since ``started``, once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _ddp_logging(model: nn.Module) -> dict[str, Any]:
    """DDP's own timing averages (ns), sampled by DDP on early iterations."""
    try:
        data = model._get_ddp_logging_data()  # type: ignore[operator]
    except (AttributeError, RuntimeError):
        return {}
    keys = (
        "avg_forward_compute_time",
        "avg_backward_compute_time",
        "avg_backward_comm_time",
        "avg_backward_compute_comm_overlap_time",
        "rebuilt_bucket_sizes",
    )
    return {k: data[k] for k in keys if k in data}


def _finish(args: argparse.Namespace, model: nn.Module, report: TrainReport) -> None:
    step_ms = sorted(r.step_ms for r in report.step_records)
    median = step_ms[len(step_ms) // 2] if step_ms else float("nan")
    _log(
        report.rank,
        f"done: {report.steps} steps, median step {median:.2f} ms, "
        f"{report.samples_per_s:.1f} samples/s, final_loss={report.final_loss:.5f} "
        f"(initial {report.initial_loss:.5f})",
    )
    if args.report_dir is not None:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        path = args.report_dir / f"rank{report.rank}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(report), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    if args.save_params is not None and report.rank == 0:
        args.save_params.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in _unwrap(model).state_dict().items()}
        torch.save(state, args.save_params)


# --------------------------------------------------------------------------- modes


def run_dp(args: argparse.Namespace) -> int:
    if args.device != "cuda" or not torch.cuda.is_available():
        why = (
            "nn.DataParallel splits each batch across CUDA devices; without CUDA it is "
            "a plain single-device call and measures nothing about DataParallel"
        )
        if not args.allow_cpu_fallback:
            print(
                f"{PREFIX}: --mode dp needs CUDA devices and none is in use ({why}). "
                "Use --mode ddp for data parallelism on CPU, or --allow-cpu-fallback to "
                "train single-device.",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(
            f"{PREFIX}: no CUDA device: running SINGLE-DEVICE on CPU instead of "
            "DataParallel (--allow-cpu-fallback); these numbers are not DP numbers.",
            file=sys.stderr,
            flush=True,
        )
        args.device = "cpu"
        train(args, mode="single")
        return 0
    device_ids = list(range(torch.cuda.device_count()))
    torch.cuda.set_device(device_ids[0])
    if len(device_ids) == 1:
        print(f"{PREFIX}: only one CUDA device: DataParallel runs on it alone", flush=True)
    train(args, mode="dp", device_ids=device_ids)
    return 0


def _init_ddp(args: argparse.Namespace, rank: int, world_size: int) -> None:
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(args.backend, rank=rank, world_size=world_size)


def _ddp_worker(rank: int, args: argparse.Namespace, world_size: int) -> int:
    """One DDP rank. Everything is written before teardown: on torch 2.13 CPU a gloo
    worker can abort in interpreter teardown after finishing (FACTS.md), so outside
    gpudiag's capture the process ends with os._exit once the group is destroyed."""
    _init_ddp(args, rank, world_size)
    code = 0
    try:
        train(args, rank=rank, world_size=world_size, mode="ddp")
    except UsageError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    finally:
        dist.destroy_process_group()
    if not _under_gpudiag_capture():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _spawn_entry(rank: int, args: argparse.Namespace, world_size: int) -> None:
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    if "OMP_NUM_THREADS" not in os.environ:
        # as torchrun does: N ranks x all cores each oversubscribes the CPU (x50 per step here)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    _ddp_worker(rank, args, world_size)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ddp(args: argparse.Namespace) -> int:
    if args.spawn:
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        try:
            mp.spawn(_spawn_entry, args=(args, args.spawn), nprocs=args.spawn, join=True)
        except mp.ProcessExitedException as exc:
            print(
                f"{PREFIX}: rank {exc.error_index} exited with code {exc.exit_code}",
                file=sys.stderr,
            )
            return exc.exit_code if exc.exit_code and exc.exit_code > 0 else 1
        return 0
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise UsageError(
            "--mode ddp needs a launcher: torchrun / `gpudiag trace --nproc-per-node N -m "
            "gpudiag.reference ...` (which set RANK and WORLD_SIZE), or --spawn N"
        )
    return _ddp_worker(int(os.environ["RANK"]), args, int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if args.mode == "dp":
            return run_dp(args)
        if args.mode == "ddp":
            return run_ddp(args)
        if args.spawn:
            raise UsageError("--spawn only applies to --mode ddp")
        train(args)
        return 0
    except UsageError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return EXIT_USAGE
