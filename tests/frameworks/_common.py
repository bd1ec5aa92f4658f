"""Shared helpers for the framework scripts of the frameworks suite (issue 29).

Only the injection knobs and a self-timing log live here; each script uses its
framework's own API as a user would write it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

INJECTS = (
    "none",
    "grad_accum",
    "slow_compute_rank",
    "slow_data_rank",
    "startup_wait",
    "grad_accum_no_sync",
)
DEFAULT_MS = {"slow_compute_rank": 40.0, "slow_data_rank": 40.0, "startup_wait": 3000.0}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--inject", choices=INJECTS, default="none")
    p.add_argument(
        "--inject-ms",
        type=float,
        default=None,
        help="injected time: ms per step (slow_*), total ms (startup_wait)",
    )
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-steps per step (grad_accum*)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--gpu",
        action="store_true",
        help="one CUDA device per rank, NCCL, bf16 where the framework offers it "
        "(tools/gpu_session.sh; the suite runs on CPU/gloo)",
    )
    p.add_argument(
        "--timing-dir", default=None, help="write rank<R>.json with each optimizer step's end time"
    )
    return p


def inject_ms(args) -> float:
    return args.inject_ms if args.inject_ms is not None else DEFAULT_MS.get(args.inject, 0.0)


def env_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return int(os.environ.get("RANK", "0"))


def busy_wait(ms: float) -> None:
    """Burn CPU for ms of wall time (a rank with extra compute)."""
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1


class SlowCollate:
    """A collate function that takes ms longer on one rank (a slow data shard/decoder)."""

    def __init__(self, collate, ms: float, slow_rank: int):
        self.collate, self.ms, self.slow_rank = collate, ms, slow_rank

    def __call__(self, batch):
        if self.ms and env_rank() == self.slow_rank:
            time.sleep(self.ms / 1000.0)
        return self.collate(batch)


class LazyOpen:
    """Dataset mixin: the first item read in each process waits `startup_s` (opening an index)."""

    startup_s = 0.0
    _opened = False

    def _maybe_open(self):
        if not self._opened:
            self._opened = True
            if self.startup_s:
                time.sleep(self.startup_s)


class StepLog:
    """Each rank's own wall-clock step ends (ground truth independent of gpudiag)."""

    def __init__(self, timing_dir):
        self.dir = timing_dir
        self.ends: list[float] = []
        self.t0 = time.time()

    def step(self):
        self.ends.append(time.time())

    def dump(self, rank=None, **extra):
        if not self.dir:
            return
        rank = env_rank() if rank is None else rank
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "t0": self.t0, "step_ends": self.ends, **extra}, f)
