"""`gpudiag bench`: single vs DataParallel vs DDP on the reference trainers, under capture.

This module parses the options; the plan, the runs and the table are in
gpudiag/reference/bench.py (the reference trainers' own package).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpudiag bench",
        description="Single vs DataParallel vs DDP (and a batch-size sweep), each under "
        "capture; prints and writes the comparison table.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default ./gpudiag_runs/bench-<time>)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="DDP ranks (default: CUDA devices, or 2 on CPU)",
    )
    p.add_argument("--model", default="mlp", help="toy | mlp | transformer (default mlp)")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument(
        "--batch-sizes",
        default="32,128",
        help="per-device batch sizes to sweep, comma separated (default 32,128)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda when available, else cpu",
    )
    p.add_argument(
        "--profile-steps",
        default=None,
        metavar="A-B",
        help="profiled window passed to gpudiag trace (default: its own)",
    )
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from gpudiag.reference.bench import run_bench

    return run_bench(args)
