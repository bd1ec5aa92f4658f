"""`gpudiag compare A B`: two runs side by side (argument parsing and exit codes only).

Exit codes: 0 ok; 2 bad usage or nothing analysable (one-line error on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _error(msg: str) -> int:
    print(f"gpudiag: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpudiag compare",
        description="Two runs side by side: step time and each breakdown component, with deltas.",
    )
    p.add_argument("a", metavar="A", help="baseline run or traces")
    p.add_argument("b", metavar="B", help="run or traces to compare with A")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)

    from gpudiag.analysis import analyze
    from gpudiag.analysis.compare import compare
    from gpudiag.analysis.result import AnalysisInputError

    try:
        a = analyze(Path(args.a), workers=args.workers)
        b = analyze(Path(args.b), workers=args.workers)
    except AnalysisInputError as exc:
        for w in exc.warnings:
            print(f"gpudiag: warning: {w}", file=sys.stderr)
        return _error(str(exc))
    for res in (a, b):
        for w in res.warnings:
            print(f"gpudiag: warning: {w}", file=sys.stderr)
    table = compare(a, b)
    if args.json:
        from gpudiag.report.jsonout import dumps

        sys.stdout.write(dumps(table.to_json()) + "\n")
    else:
        from gpudiag.report.terminal import print_comparison

        print_comparison(table)
    return 0
