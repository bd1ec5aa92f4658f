"""Cost of `gpudiag trace --no-profile` on a 2-rank gloo DDP job.

Runs the same job bare (torchrun) and under gpudiag, interleaved A B A B in one
invocation, and prints the ratio of median step times. Step times are measured the same
way in both: the training script (tests/scripts/capture_ddp_mlp.py) times its own steps
with perf_counter and appends them to a file. Target: ratio <= 1.02.

    python bench/overhead.py [--pairs 4] [--steps 80] [--width 512] [--depth 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
WARMUP_STEPS = 5


def run_job(mode: str, workdir: Path, index: int, args: argparse.Namespace) -> list[float]:
    times = workdir / f"{mode}-{index}.jsonl"
    script = [
        str(SCRIPT),
        "--steps",
        str(args.steps),
        "--width",
        str(args.width),
        "--depth",
        str(args.depth),
        "--times",
        str(times),
    ]
    torchrun = ["--nproc-per-node", "2", "--standalone"]
    if mode == "bare":
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, *script]
    else:
        cmd = [
            sys.executable,
            "-m",
            "gpudiag",
            "trace",
            "--out",
            str(workdir / f"run-{index}"),
            "--no-profile",
            "--no-lint",
            *torchrun,
            *script,
        ]
    subprocess.run(
        cmd,
        check=True,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    step_ms: list[float] = []
    for line in times.read_text().splitlines():
        step_ms += json.loads(line)["ms"][WARMUP_STEPS:]
    return step_ms


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    args = p.parse_args()
    medians: dict[str, list[float]] = {"bare": [], "gpudiag": []}
    with tempfile.TemporaryDirectory(prefix="gpudiag-overhead-") as tmp:
        workdir = Path(tmp)
        for i in range(args.pairs):
            for mode in ("bare", "gpudiag"):
                medians[mode].append(statistics.median(run_job(mode, workdir, i, args)))
            print(
                f"pair {i + 1}: bare {medians['bare'][-1]:7.3f} ms   "
                f"gpudiag {medians['gpudiag'][-1]:7.3f} ms   "
                f"ratio {medians['gpudiag'][-1] / medians['bare'][-1]:.3f}",
                flush=True,
            )
    bare = statistics.median(medians["bare"])
    traced = statistics.median(medians["gpudiag"])
    pair_ratios = sorted(g / b for g, b in zip(medians["gpudiag"], medians["bare"], strict=True))
    print(f"\nmedian step time   bare {bare:.3f} ms   gpudiag --no-profile {traced:.3f} ms")
    print(
        f"ratio gpudiag/bare {traced / bare:.3f}  (target <= 1.02; per-pair ratios "
        f"{', '.join(f'{r:.3f}' for r in pair_ratios)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
