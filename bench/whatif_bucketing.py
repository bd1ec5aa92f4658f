"""Check the realistic bucketing gain (`comm_bucketed` in `gpudiag whatif`): record a DDP
job on gloo at 2 ranks with DDP's default buckets, take its projected step, record the
same job with smaller buckets (``--bucket-cap-mb``), compare. Alternated, several
repetitions; medians and ranges printed, with the bound (`comm_overlapped`) beside.

    python bench/whatif_bucketing.py [--reps 3] [--cap-mb 0.5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whatif_scale import JOB, record  # noqa: E402


def _analyse(run: Path) -> tuple[float, dict[str, float]]:
    from gpudiag.analysis import analyze

    result = analyze(run)
    return result.step_ms, {p.scenario: p.projected_step_ms for p in result.whatif}


def _line(name: str, values: list[float], actual: float | None = None) -> str:
    if not values:
        return f"{name}: none"
    med = statistics.median(values)
    err = f", {100 * (med / actual - 1):+.1f} % vs the re-bucketed job" if actual else ""
    return f"{name}: {med:.1f} ms ({min(values):.1f}-{max(values):.1f}){err}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cap-mb", type=float, default=0.5)
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="whatif_bucketing_"))
    root.mkdir(parents=True, exist_ok=True)
    base, rebucketed = [], []
    predicted: dict[str, list[float]] = {"comm_bucketed": [], "comm_overlapped": []}
    try:
        for rep in range(args.reps):
            record(root / f"default_{rep}", 2, JOB)
            step, proj = _analyse(root / f"default_{rep}")
            base.append(step)
            for name in predicted:
                if name in proj:
                    predicted[name].append(proj[name])
            small = [*JOB, "--bucket-cap-mb", str(args.cap_mb)]
            record(root / f"small_{rep}", 2, small)
            rebucketed.append(_analyse(root / f"small_{rep}")[0])
            print(
                f"rep {rep}: default buckets {step:.1f} ms "
                + ", ".join(f"{k} {v:.1f}" for k, v in proj.items())
                + f"; bucket_cap_mb={args.cap_mb}: {rebucketed[-1]:.1f} ms"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    actual = statistics.median(rebucketed)
    print(_line("default buckets, measured", base))
    print(_line(f"bucket_cap_mb={args.cap_mb}, measured", rebucketed))
    for name, values in predicted.items():
        print(_line(f"{name}, predicted from the default run", values, actual))


if __name__ == "__main__":
    main()
