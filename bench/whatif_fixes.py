"""Check the what-if projections of fixes against the job with the fix made: record on
gloo, 2 ranks, a job with one slow rank (30 ms more forward on rank 1) and one with a slow
DataLoader (30 ms per batch on every rank), project `straggler_fixed` and
`dataloader_fixed`, and record the fixed job (the same job without the slowdown). The
three are alternated within each repetition, so all see the same load. Every step also
sleeps 30 ms on all ranks, so the step is not dominated by compute that two cores shared
by two ranks make noisy. Prints median and spread; the goal is within 10 %.

The recordings of one repetition are tests/fixtures/whatif_fixes/ (see its README), which
tests/test_whatif.py checks the projections on.

    python bench/whatif_fixes.py [--reps 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from whatif_scale import _port  # bench/ is on sys.path: its free-port helper

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "suite_train.py"
JOB = ["--steps", "40", "--width", "32", "--depth", "2", "--batch", "8",
       "--opt-ms", "30", "--opt-ranks", "all"]  # fmt: skip
VARIANTS = {
    "base": [],
    "straggler": ["--fwd-ms", "30", "--fwd-ranks", "1"],
    "slow_data": ["--data-ms", "30", "--data-ranks", "all"],
}
SCENARIO = {"straggler": "straggler_fixed", "slow_data": "dataloader_fixed"}


def record(out: Path, extra: list[str]) -> None:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2",
        "--master-port", str(_port()), "--out", str(out), "--no-lint",
        "--profile-steps", "10-14", str(SCRIPT), *JOB, *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"recording {out} failed:\n{proc.stderr[-2000:]}")


def measured(run: Path, name: str) -> float:
    """The fixed job's steady step (``base``), else the projected step of the fix."""
    from gpudiag.analysis import analyze

    result = analyze(run)
    if name == "base":
        assert result.run.steady_step_ms is not None
        return result.run.steady_step_ms
    return next(p for p in result.whatif if p.scenario == SCENARIO[name]).projected_step_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="keep the recorded runs here")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="whatif_fixes_"))
    root.mkdir(parents=True, exist_ok=True)
    values: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for rep in range(args.reps):
            for name, extra in VARIANTS.items():
                out = root / f"{name}{rep}"
                record(out, extra)
                values[name].append(measured(out, name))
                print(f"rep {rep} {name}: {values[name][-1]:.1f} ms", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    fixed = values["base"]
    print("\nfix | projected ms (median, min-max) | fixed job ms (median, min-max) | error")
    for name in SCENARIO:
        p = values[name]
        err = statistics.median(p) / statistics.median(fixed) - 1
        print(
            f"{SCENARIO[name]} | {statistics.median(p):.1f} ({min(p):.1f}-{max(p):.1f}) | "
            f"{statistics.median(fixed):.1f} ({min(fixed):.1f}-{max(fixed):.1f}) | "
            f"{100 * err:+.1f} %"
        )


if __name__ == "__main__":
    main()
