"""`gpudiag whatif RUN`: the step time each fix would give (argument parsing and exit
codes only; the projections are gpudiag/analysis/whatif.py).

Exit codes: 0 ok; 2 bad usage or nothing analysable (one-line error on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult
    from gpudiag.analysis.scaling import ScaleProjection

ALGORITHMS = ("ring", "tree")  # gpudiag.analysis.scaling.ALGORITHMS (imported lazily)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpudiag whatif",
        description="Projected step time for the fix of each finding: mean, range, saving "
        "and the assumptions (docs/whatif.md).",
    )
    p.add_argument("run", metavar="RUN", help="run directory or folder of profiler traces")
    p.add_argument("--json", action="store_true", help="print the projections as JSON")
    p.add_argument("--workers", type=int, default=None)
    scale = p.add_argument_group(
        "scale", "project the step time at another world size (weak scaling, docs/whatif.md)"
    )
    scale.add_argument("--world-size", type=int, metavar="N", help="ranks to project to")
    scale.add_argument("--nodes", type=int, default=1, metavar="M", help="nodes (default 1)")
    scale.add_argument(
        "--inter-node-gbps",
        type=float,
        metavar="GBPS",
        help="bus bandwidth between nodes, GB/s per rank (default: the link this run measured)",
    )
    scale.add_argument("--algorithm", choices=ALGORITHMS, default="ring")
    scale.add_argument(
        "--cores-per-node", type=int, metavar="C", help="default: the run's os.cpu_count()"
    )
    scale.add_argument(
        "--threads-per-rank", type=int, metavar="T", help="default: OMP_NUM_THREADS, else 1"
    )
    args = p.parse_args(argv)
    bad = _check_scale_args(args)
    if bad:
        print(f"gpudiag: error: {bad}", file=sys.stderr)
        return 2

    from gpudiag.analysis import analyze
    from gpudiag.analysis.result import AnalysisInputError
    from gpudiag.analysis.whatif import mean_step_ms

    try:
        result = analyze(Path(args.run), workers=args.workers)
    except AnalysisInputError as exc:
        for w in exc.warnings:
            print(f"gpudiag: warning: {_one_line(w)}", file=sys.stderr)
        print(f"gpudiag: error: {exc}", file=sys.stderr)
        return 2
    for w in result.warnings:
        print(f"gpudiag: warning: {_one_line(w)}", file=sys.stderr)
    projections = result.whatif
    scaled = _scale(result, args) if args.world_size else None
    if args.world_size and scaled is None:
        print(f"gpudiag: error: {args.run}: no step time to scale", file=sys.stderr)
        return 2
    if args.json:
        from gpudiag.report.jsonout import dumps

        payload = {
            "source": str(result.source),
            # the step the projections start from: the steady step where the run has one
            "step_ms": result.step_ms,
            "window_step_ms": mean_step_ms(result.ranks),
            "whatif": [p.to_json() for p in projections],
        }
        if scaled is not None:
            payload["scale"] = scaled.to_json()
        sys.stdout.write(dumps(payload) + "\n")
    else:
        from gpudiag.report.terminal import print_scale, print_whatif

        steady = result.run.steady_step_ms is not None
        print_whatif(
            result.source,
            result.step_ms,
            projections,
            window_ms=mean_step_ms(result.ranks) if steady else None,
        )
        if scaled is not None:
            print_scale(scaled)
    return 0


def _check_scale_args(args: argparse.Namespace) -> str | None:
    if args.world_size is None:
        if args.nodes != 1 or args.inter_node_gbps is not None:
            return "--nodes and --inter-node-gbps need --world-size"
        return None
    if args.world_size < 1 or args.nodes < 1 or args.world_size < args.nodes:
        return "--world-size and --nodes must be positive, with at least one rank per node"
    if args.inter_node_gbps is not None and not args.inter_node_gbps > 0:
        return "--inter-node-gbps must be positive"
    for name in ("cores_per_node", "threads_per_rank"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be positive"
    return None


def _scale(result: AnalysisResult, args: argparse.Namespace) -> ScaleProjection | None:
    from gpudiag.analysis.scaling import project_scale, scale_inputs

    run = result.run
    inputs = scale_inputs(
        run,
        cpu_run=not run.has_gpu_trace and run.backend != "nccl",
        cores_per_node=args.cores_per_node,
        threads_per_rank=args.threads_per_rank,
        host_samples=result.host_samples,
        steps=result.run_steps,
    )
    return project_scale(
        result.ranks,
        result.breakdown,
        result.collectives.frame(),
        inputs,
        args.world_size,
        nodes=args.nodes,
        algorithm=args.algorithm,
        inter_node_gbps=args.inter_node_gbps,
    )


def _one_line(warning: object) -> str:
    """A warning naming a path or carrying a run's text, on one line and safe to print."""
    from gpudiag import rundir

    return rundir.one_line(str(warning))
