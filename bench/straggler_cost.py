"""Is a straggler's cost what the fix gives back? Records the same 2-rank gloo DDP job
(gpudiag.reference, MLP, several gradient buckets) healthy and with one rank sleeping
SLOW_MS in its forward, alternated, REPS times; the gain is the median step of the slow
run minus that of the healthy run next to it, timed from the runs' own steps tables.
Prints, per repetition and as median [min-max]: the gain, gpudiag's straggler cost (the
installed code, and a --before tree's), and their errors.

    python bench/straggler_cost.py --reps 4 [--before /tmp/before] [--bucket-cap-mb 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def record(out: Path, slow_ms: float, bucket_cap_mb: float, port: int) -> None:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
        "--nproc-per-node", "2", "--master-port", str(port),
        "-m", "gpudiag.reference", "--quiet", "--mode", "ddp", "--model", "mlp",
        "--steps", "16", "--batch-size", "256", "--bucket-cap-mb", str(bucket_cap_mb),
        "--seed", "0", "--slow-rank", "1", "--slow-ms", str(slow_ms),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)


def median_step_ms(run: Path) -> float:
    """Rank 0's median step (steps after the first two), from the run's steps table."""
    rows = [json.loads(line) for line in (run / "rank0" / "steps.jsonl").read_text().splitlines()]
    return statistics.median((r["end_ns"] - r["start_ns"]) / 1e6 for r in rows[2:])


def straggler_cost(run: Path, tree: Path | None) -> float:
    env = dict(os.environ)
    cwd = None
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        cwd = tree
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json"],
        capture_output=True, text=True, env=env, cwd=cwd, check=True,
    )  # fmt: skip
    found = [f for f in json.loads(done.stdout)["findings"] if f["kind"] == "straggler"]
    return max((f["cost_ms_per_step"] for f in found), default=0.0)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--slow-ms", type=float, default=40.0)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.5)
    ap.add_argument("--before", type=Path, default=None, help="a gpudiag tree to compare")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="straggler_cost_"))
    gains, errors, errors_before = [], [], []
    for rep in range(args.reps):
        order = [0.0, args.slow_ms] if rep % 2 == 0 else [args.slow_ms, 0.0]
        runs = {}
        for slow in order:
            runs[slow] = out / f"rep{rep}_slow{slow:.0f}"
            record(runs[slow], slow, args.bucket_cap_mb, 29600 + rep * 2 + (slow > 0))
        gain = median_step_ms(runs[args.slow_ms]) - median_step_ms(runs[0.0])
        cost = straggler_cost(runs[args.slow_ms], None)
        line = f"rep {rep}: gain {gain:6.1f} ms  cost {cost:6.1f} ({(cost - gain) / gain:+.0%})"
        gains.append(gain)
        errors.append((cost - gain) / gain)
        if args.before is not None:
            old = straggler_cost(runs[args.slow_ms], args.before)
            errors_before.append((old - gain) / gain)
            line += f"  before {old:6.1f} ({(old - gain) / gain:+.0%})"
        print(line, flush=True)
    print(f"gain ms: {spread(gains)}; cost error: {spread([100 * e for e in errors])} %")
    if errors_before:
        print(f"before, cost error: {spread([100 * e for e in errors_before])} %")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
