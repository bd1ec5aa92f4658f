"""`gpudiag analyze`: argument parsing and exit codes only.

Exit codes of `gpudiag analyze`: 0 ok; 1 a finding at or above --fail-on exists (and
the input was sound); 2 bad usage, nothing analysable, bad input (a file, or part of one,
was unusable: the report of the rest is still written, and each problem is a one-line
warning naming the file), or the report could not be written (--html, stdout). Never a
traceback. Heavy modules (pandas, rich, plotly) load only when needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.paths import sample_runs_dir


def _analyze_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpudiag analyze",
        description="Find the bottlenecks of a gpudiag run directory or of profiler traces.",
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="run directory, trace directory or trace file (default: every run in sample_runs/)",
    )
    p.add_argument("--json", action="store_true", help="print the full result as JSON on stdout")
    p.add_argument("--html", metavar="FILE", help="write a standalone HTML report (opens offline)")
    p.add_argument(
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit 1 when a finding of this severity or worse exists",
    )
    p.add_argument("--workers", type=int, default=None, help="processes for trace loading")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run ingest and the per-rank analyses on a Dask cluster: the scheduler's "
        "tcp://host:port, or local:N for a local cluster of N workers; workers must see "
        "the traces at the same paths (needs pip install 'gpudiag[cluster]'; docs/cluster.md)",
    )
    p.add_argument("--rank", type=int, default=None, help="only this rank in the per-rank table")
    p.add_argument(
        "--summaries-only",
        action="store_true",
        help="read only rank*/summary.json (automatic above 256 ranks)",
    )
    return p


def _error(msg: str) -> int:
    print(f"gpudiag: error: {rundir.one_line(msg)}", file=sys.stderr)
    return 2


EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    args = _analyze_parser().parse_args(argv)
    paths = [Path(p) for p in args.paths]
    if args.html and Path(args.html).is_dir():
        return _error(f"--html {args.html}: is a directory; give a file name")
    if not paths:
        root = sample_runs_dir()
        paths = rundir.sample_run_paths(root)
        if not paths:
            return _error(f"no PATH given and no runs in {root}")
        print(f"gpudiag: analysing the shipped sample runs in {root}:", file=sys.stderr)
        for p in paths:
            print(f"  {p.relative_to(root)}", file=sys.stderr)

    if args.scheduler and args.workers is not None:
        return _error("--workers sizes the local pool; with --scheduler the cluster's workers run")
    if args.scheduler and not args.summaries_only:
        from gpudiag.analysis.dask_tasks import ClusterError, connect

        try:
            tasks = connect(args.scheduler)
        except ClusterError as exc:
            return _error(str(exc))
        try:
            return _analyze_paths(paths, args, tasks)
        except ClusterError as exc:
            return _error(str(exc))
        finally:
            tasks.close()
    return _analyze_paths(paths, args, None)


def _analyze_paths(paths: list[Path], args: argparse.Namespace, run_tasks: Any) -> int:
    from gpudiag.analysis import analyze
    from gpudiag.analysis.result import AnalysisInputError
    from gpudiag.analysis.summaries import analyze_summaries
    from gpudiag.rundir import BadInput

    results = []
    bad_input = False
    # the per-node directories of one multi-node job are one run
    groups = rundir.group_node_dirs(paths)
    if len(groups) == 1 and len(groups[0]) > 1:
        parts = (
            "directories of one job whose ranks were launched separately"
            if rundir.launched_separately(groups[0])
            else "node directories of one multi-node job"
        )
        print(f"gpudiag: {len(paths)} {parts}: merged", file=sys.stderr)
    for group in groups:
        path = group[0]
        try:
            if len(group) > 1:
                res = analyze(group, workers=args.workers, run_tasks=run_tasks)
            elif args.summaries_only:
                res = analyze_summaries(path)
            else:
                res = analyze(path, workers=args.workers, run_tasks=run_tasks)
        except AnalysisInputError as exc:
            for w in exc.warnings:
                print(f"gpudiag: warning: {rundir.one_line(str(w))}", file=sys.stderr)
            if len(groups) == 1:
                return _error(str(exc))
            print(f"gpudiag: warning: {rundir.one_line(str(exc))}", file=sys.stderr)
            bad_input = True
            continue
        for w in res.warnings:
            print(f"gpudiag: warning: {rundir.one_line(str(w))}", file=sys.stderr)
        bad_input = bad_input or any(isinstance(w, BadInput) for w in res.warnings)
        results.append(res)
    if not results:
        return _error("nothing analysable in " + ", ".join(map(str, paths)))

    try:
        _render(results, args)
    except BrokenPipeError:
        raise  # the reader of stdout went away (`| head`): gpudiag's main ends quietly, 0
    except OSError as exc:  # --html into a directory or a full disk; stdout on a full disk
        where = args.html if args.html and exc.filename else "the report"
        return _error(f"cannot write {where} ({exc.strerror or exc})")
    if bad_input:
        print(
            "gpudiag: some input was unusable (warnings above); exit code 2",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.fail_on:
        from gpudiag.analysis.findings import at_least

        if any(at_least(r.findings, args.fail_on) for r in results):
            return EXIT_FINDINGS
    return EXIT_OK


def _render(results: list[Any], args: argparse.Namespace) -> None:
    if args.html:
        from gpudiag.report.html import write_html

        out = write_html(results, Path(args.html))
        print(f"gpudiag: wrote {out}", file=sys.stderr)
    if args.json:
        from gpudiag.report.jsonout import write_results

        write_results(results, sys.stdout)
        sys.stdout.flush()
    elif not args.html or sys.stdout.isatty():
        from gpudiag.report.terminal import print_report, print_summary

        for res in results:
            print_report(res, rank=args.rank)
        if len(results) > 1:
            print_summary(results)
        sys.stdout.flush()
