"""Check `gpudiag whatif --world-size`: record a DDP job on gloo at 2 ranks, predict its
step at 3 and 4 ranks, record the same job at 3 and 4 ranks, compare. The world sizes are
alternated within each repetition (2, 3, 4, 2, 3, 4, ...), so all see the same load.

Every rank runs one torch thread (OMP_NUM_THREADS=1); the cores per rank are printed: on a
2-core machine 3 and 4 ranks oversubscribe the cores, which the model accounts for
(gpudiag/analysis/scaling.py, docs/whatif.md).

    python bench/whatif_scale.py [--reps 3] [--sizes 3,4] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "suite_train.py"
JOB = ["--steps", "30", "--width", "512", "--depth", "4", "--batch", "32"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(out: Path, ranks: int, job: list[str]) -> float:
    """Record the job at ``ranks`` ranks; wall seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", str(ranks),
        "--master-port", str(_port()), "--out", str(out), "--no-lint",
        "--profile-steps", "10-19", str(SCRIPT), *job,
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"recording {out} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def step_and_predictions(run: Path, sizes: list[int]) -> tuple[float, dict[int, float]]:
    from gpudiag.analysis import analyze
    from gpudiag.analysis.scaling import project_scale, scale_inputs
    from gpudiag.analysis.whatif import mean_step_ms

    result = analyze(run)
    inputs = scale_inputs(
        result.run,
        cpu_run=not result.run.has_gpu_trace,
        host_samples=result.host_samples,
        steps=result.run_steps,
    )
    predicted = {}
    for n in sizes:
        p = project_scale(result.ranks, result.breakdown, result.collectives.frame(), inputs, n)
        predicted[n] = p.projected_step_ms if p else float("nan")
    return mean_step_ms(result.ranks), predicted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="3,4", help="world sizes to predict and record")
    ap.add_argument("--keep", type=Path, help="keep the recorded runs here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = args.keep or Path(tempfile.mkdtemp(prefix="whatif_scale_"))
    root.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print(f"{cores} cores; 1 torch thread per rank; job: suite_train.py {' '.join(JOB)}")
    for n in [2, *sizes]:
        print(f"  {n} ranks: {cores / n:.2f} cores per rank")
    predicted: dict[int, list[float]] = {n: [] for n in sizes}
    actual: dict[int, list[float]] = {n: [] for n in [2, *sizes]}
    try:
        for rep in range(args.reps):
            for n in [2, *sizes]:
                out = root / f"r{n}_{rep}"
                record(out, n, JOB)
                step, pred = step_and_predictions(out, sizes if n == 2 else [])
                actual[n].append(step)
                for m, v in pred.items():
                    predicted[m].append(v)
                extra = ", ".join(f"predicts {m}: {v:.1f}" for m, v in pred.items())
                print(f"rep {rep} {n} ranks: step {step:.1f} ms" + (f" ({extra})" if extra else ""))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print("\nworld size | predicted ms (median, min-max) | recorded ms (median, min-max) | error")
    for n in sizes:
        p, a = predicted[n], actual[n]
        err = statistics.median(p) / statistics.median(a) - 1
        print(
            f"{n} | {statistics.median(p):.1f} ({min(p):.1f}-{max(p):.1f}) | "
            f"{statistics.median(a):.1f} ({min(a):.1f}-{max(a):.1f}) | {100 * err:+.1f} %"
        )
    base = actual[2]
    print(f"2 (measured) | - | {statistics.median(base):.1f} ({min(base):.1f}-{max(base):.1f}) | -")
    per_rep = [
        100 * (predicted[n][i] / actual[n][i] - 1) for n in sizes for i in range(len(actual[n]))
    ]
    print(
        f"per-repetition errors (same rep's recording): {', '.join(f'{e:+.0f} %' for e in per_rep)}"
    )


if __name__ == "__main__":
    main()
