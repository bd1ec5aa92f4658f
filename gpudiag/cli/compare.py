"""`gpudiag compare A B`: two runs side by side (argument parsing and exit codes only).

Exit codes: 0 ok (and no regression beyond --fail-on-regression); 1 B's step time is slower
than A's by more than --fail-on-regression percent with confidence; 2 bad usage, nothing
analysable, or too few steps to judge a regression (one-line error on stderr).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def _error(msg: str) -> int:
    print(f"gpudiag: error: {msg}", file=sys.stderr)
    return 2


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage from 0 to 1000")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpudiag compare",
        description="Two runs side by side: step time and each breakdown component, with "
        "deltas, and the findings that changed. With --fail-on-regression, a CI gate.",
    )
    p.add_argument("a", metavar="BASE", help="baseline run or traces")
    p.add_argument("b", metavar="NEW", help="run or traces to compare with BASE")
    p.add_argument(
        "--fail-on-regression",
        metavar="PCT",
        type=_percent,
        default=None,
        help="exit 1 when NEW's median step time is slower than BASE's by more than PCT "
        "percent with 95 %% confidence (bootstrap over every step of the run tables)",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the comparison as JSON")
    fmt.add_argument(
        "--format",
        choices=("text", "json", "markdown"),
        default="text",
        help="text (default), json, or markdown (a pull-request comment)",
    )
    p.add_argument("--workers", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    output = "json" if args.json else args.format

    from gpudiag.analysis import analyze
    from gpudiag.analysis.compare import compare
    from gpudiag.analysis.regression import NotEnoughSteps
    from gpudiag.analysis.result import AnalysisInputError

    try:
        a = analyze(Path(args.a), workers=args.workers)
        b = analyze(Path(args.b), workers=args.workers)
    except AnalysisInputError as exc:
        for w in exc.warnings:
            print(f"gpudiag: warning: {_one_line(w)}", file=sys.stderr)
        return _error(str(exc))
    for res in (a, b):
        for w in res.warnings:
            print(f"gpudiag: warning: {_one_line(w)}", file=sys.stderr)
    try:
        comparison = compare(a, b, regression_threshold_pct=args.fail_on_regression)
    except NotEnoughSteps as exc:
        return _error(str(exc))
    if output == "json":
        from gpudiag.report.jsonout import dumps

        sys.stdout.write(dumps(comparison.to_json()) + "\n")
    elif output == "markdown":
        from gpudiag.report.markdown import comparison_markdown

        sys.stdout.write(comparison_markdown(comparison))
    else:
        from gpudiag.report.terminal import print_comparison

        print_comparison(comparison, runs=(a, b))
    verdict = comparison.regression
    return 1 if verdict is not None and verdict.regressed else 0


def _one_line(warning: object) -> str:
    """A warning naming a path or carrying a run's text, on one line and safe to print."""
    from gpudiag import rundir

    return rundir.one_line(str(warning))
