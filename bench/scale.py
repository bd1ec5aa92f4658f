"""Scale check: analyse a SYNTHETIC 1024-rank run made only of per-rank summary.json
files (clearly synthetic: the manifest says so; nothing here was recorded).

Builds the run in a temporary directory, then analyses it in a fresh subprocess
(`gpudiag.analysis.analyze`, which takes the summaries-only path above 256 ranks) and
prints wall time and peak RSS side by side with the targets (30 s, 4 GB).

    python bench/scale.py [--ranks 1024] [--slow-rank 617]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 30.0
TARGET_GB = 4.0

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from gpudiag.analysis import analyze
res = analyze(sys.argv[1])
payload = res.to_json()
elapsed = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "peak_gb": peak_kb / 2**20,
                  "findings": [(f["kind"], f["ranks"][:5]) for f in payload["findings"]],
                  "ranks": len(payload["ranks"])}))
"""


def write_synthetic_run(root: Path, ranks: int, slow_rank: int, seed: int = 0) -> None:
    """Summaries shaped like gpudiag/capture/summary.py writes them. One slow rank waits
    ~20 ms less per step inside collectives (the others wait for it)."""
    from gpudiag import rundir

    rng = random.Random(seed)
    rundir.write_json_atomic(
        rundir.manifest_path(root),
        {
            "format_version": rundir.FORMAT_VERSION,
            "world_size": ranks,
            "backend": "nccl",
            "status": "ok",
            "exit_code": 0,
            "synthetic": True,
            "note": "synthetic run for bench/scale.py; not a recording",
        },
    )
    steps = 500
    for r in range(ranks):
        wait_ms = 2.0 if r == slow_rank else 22.0 + rng.gauss(0, 0.5)
        step_ms = 100.0 + rng.gauss(0, 0.3)
        colls = [
            {
                "op": "all_reduce",
                "pg_name": "0",
                "count": steps * 4,
                "bytes": steps * 4 * 25 * 2**20,
                "known_time_ns": int(wait_ms * 1e6 * steps),
            },
            {
                "op": "broadcast",
                "pg_name": "0",
                "count": 2,
                "bytes": 2 * 2**20,
                "known_time_ns": 1000,
            },
        ]
        summary = {
            "format_version": rundir.FORMAT_VERSION,
            "rank": r,
            "status": "ok",
            "steps": {
                "count": steps,
                "mean_ms": step_ms,
                "median_ms": step_ms,
                "p90_ms": step_ms * 1.02,
                "min_ms": step_ms * 0.97,
                "max_ms": step_ms * 1.1,
                "total_ms": step_ms * steps,
                "data_ms_mean": 1.0 + rng.random(),
                "optimizer_ms_mean": 3.0,
            },
            "collectives": {"collectives": colls, "fr_lost_records": 0},
            "profiled_steps": [],
            "trace": None,
        }
        path = rundir.rank_dir(root, r) / rundir.SUMMARY
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--slow-rank", type=int, default=617)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudiag-scale-") as tmp:
        run = Path(tmp) / "synthetic_run"
        t0 = time.perf_counter()
        write_synthetic_run(run, args.ranks, args.slow_rank)
        build_s = time.perf_counter() - t0
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        m = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"synthetic run: {args.ranks} ranks of summary.json (built in {build_s:.1f} s)")
    print(f"{'metric':<12}{'measured':>12}{'target':>10}{'ratio':>8}")
    print(f"{'time s':<12}{m['seconds']:>12.2f}{TARGET_S:>10.1f}{m['seconds'] / TARGET_S:>8.3f}")
    print(f"{'peak GB':<12}{m['peak_gb']:>12.3f}{TARGET_GB:>10.1f}{m['peak_gb'] / TARGET_GB:>8.3f}")
    print(f"ranks analysed: {m['ranks']}; findings: {m['findings']}")
    ok = m["seconds"] <= TARGET_S and m["peak_gb"] <= TARGET_GB
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
