"""`gpudiag whatif RUN`: the step time each fix would give (argument parsing and exit
codes only; the projections are gpudiag/analysis/whatif.py).

Exit codes: 0 ok; 2 bad usage or nothing analysable (one-line error on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpudiag whatif",
        description="Projected step time for the fix of each finding: mean, range, saving "
        "and the assumptions (docs/whatif.md).",
    )
    p.add_argument("run", metavar="RUN", help="run directory or folder of profiler traces")
    p.add_argument("--json", action="store_true", help="print the projections as JSON")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)

    from gpudiag.analysis import analyze
    from gpudiag.analysis.result import AnalysisInputError
    from gpudiag.analysis.whatif import mean_step_ms

    try:
        result = analyze(Path(args.run), workers=args.workers)
    except AnalysisInputError as exc:
        for w in exc.warnings:
            print(f"gpudiag: warning: {w}", file=sys.stderr)
        print(f"gpudiag: error: {exc}", file=sys.stderr)
        return 2
    for w in result.warnings:
        print(f"gpudiag: warning: {w}", file=sys.stderr)
    projections = result.whatif
    if args.json:
        from gpudiag.report.jsonout import dumps

        payload = {
            "source": str(result.source),
            "step_ms": mean_step_ms(result.ranks),
            "whatif": [p.to_json() for p in projections],
        }
        sys.stdout.write(dumps(payload) + "\n")
    else:
        from gpudiag.report.terminal import print_whatif

        print_whatif(result.source, mean_step_ms(result.ranks), projections)
    return 0
