"""The small per-rank summary.json written when a rank ends: enough to analyse a
1000-rank run without opening any trace or table."""

from __future__ import annotations

from typing import Any

from gpudiag import rundir


def build_summary(
    rank: int,
    status: str,
    step_stats: dict[str, Any],
    collectives: dict[str, Any] | None,
    profiled_steps: list[int],
    trace_written: bool,
) -> dict[str, Any]:
    return {
        "format_version": rundir.FORMAT_VERSION,
        "rank": rank,
        "status": status,
        "steps": step_stats,
        "collectives": collectives or {},
        "profiled_steps": profiled_steps,
        "trace": rundir.trace_path(".", rank).as_posix() if trace_written else None,
    }
