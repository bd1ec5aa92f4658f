"""Start-up: how long ranks waited, before their first step, for a rank that came late to
the job's first collectives (DDP's construction: the all_gather and broadcasts of
``DDP(model)``; a barrier after loading).

A rank that prepares alone after ``init_process_group`` (rank 0 downloads, preprocesses
or reads a checkpoint, then builds DDP) keeps the others waiting in their first
collective: paid once per run (and per restart), never per step, so it is reported once,
low, with no per-step cost (probe 29i: a 4 s wait before ``DDP()`` was reported nowhere).

Each start-up call's waits are its participants' arrivals (the enqueue times of the
Flight Recorder or gpudiag's record, on the run's aligned clock) against the last one's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.findings import Finding, ms
from gpudiag.rundir import Run

# A start-up wait is reported when it is at least this long and this many steady steps:
# ranks of a healthy job reach their first collective within a second or so of each
# other (imports, a loaded host).
STARTUP_WAIT_MIN_MS = 2000.0
STARTUP_WAIT_MIN_STEPS = 10.0
STARTUP_WAIT_FIX = (
    "Paid once per run (and per restart), not per step: the late rank reached its first "
    "collective after the others, doing work of its own first (a download, preprocessing, "
    "reading a checkpoint or building a model on one rank). Where it matters (short jobs, "
    "many restarts, many ranks waiting), do that work before init_process_group, share it "
    "out across the ranks, or cache its result; the other ranks cannot start until it "
    "arrives."
)
_KEYS = ["pg_name", "seq"]


def startup_waits(collectives: object, steps: object) -> pd.DataFrame | None:
    """Per start-up call (``pg_name``, ``seq``, ``op``): the last rank to arrive (``late``)
    and the ms each other rank waited for it (``wait_ms``, one row per waiting rank).
    Start-up calls are those a rank entered before its first step began. None without the
    tables (foreign traces, a run with no collectives or no steps)."""
    if not isinstance(collectives, pd.DataFrame) or not isinstance(steps, pd.DataFrame):
        return None
    needed = {"rank", "pg_name", "seq", "op", "enqueue_ns"}
    if collectives.empty or steps.empty or not needed <= set(collectives.columns):
        return None
    first_step = steps.groupby("rank")["start_ns"].min()
    calls = collectives[list(needed)].copy()
    calls["enqueue_ns"] = pd.to_numeric(calls["enqueue_ns"], errors="coerce")
    calls["first_step_ns"] = calls["rank"].map(first_step)
    calls = calls[calls["enqueue_ns"] < calls["first_step_ns"]].dropna(subset=["enqueue_ns"])
    calls = calls.drop_duplicates(["rank", *_KEYS])
    if calls.empty:
        return None
    grouped = calls.groupby(_KEYS, sort=False)["enqueue_ns"]
    calls["last_ns"] = grouped.transform("max")
    calls["participants"] = grouped.transform("size")
    calls = calls[calls["participants"] > 1]
    if calls.empty:
        return None
    late = calls.loc[calls.groupby(_KEYS, sort=False)["enqueue_ns"].idxmax(), [*_KEYS, "rank"]]
    calls = calls.merge(late.rename(columns={"rank": "late"}), on=_KEYS)
    calls["wait_ms"] = (calls["last_ns"] - calls["enqueue_ns"]) / 1e6
    waiting = calls[calls["rank"] != calls["late"]]
    return waiting[["pg_name", "seq", "op", "rank", "late", "wait_ms"]].reset_index(drop=True)


def startup_wait_findings(waits: pd.DataFrame | None, step_ms: float) -> list[Finding]:
    """One low finding for the start-up wait, when some rank waited long enough in all
    (:data:`STARTUP_WAIT_MIN_MS`, :data:`STARTUP_WAIT_MIN_STEPS` steady steps)."""
    if waits is None or waits.empty:
        return []
    per_rank = waits.groupby("rank")["wait_ms"].sum()
    worst = float(per_rank.max())
    if worst < STARTUP_WAIT_MIN_MS or (step_ms > 0 and worst < STARTUP_WAIT_MIN_STEPS * step_ms):
        return []
    longest = waits.loc[waits["wait_ms"].idxmax()]
    late_by_wait = waits.groupby("late")["wait_ms"].sum()
    late = sorted(int(r) for r, v in late_by_wait.items() if v >= 0.5 * float(late_by_wait.max()))
    waited = ", ".join(
        f"rank {int(r)}: {v / 1000:.2f} s" for r, v in per_rank.items() if v >= 0.1 * worst
    )
    who = " and ".join(f"rank {r}" for r in late)
    return [
        Finding(
            kind="startup_wait",
            severity="low",
            cost_ms_per_step=0.0,
            ranks=late,
            title=(
                f"Before the first step, the other ranks waited up to {worst / 1000:.2f} s "
                f"for {who} to reach the job's first collectives ({waited}; the longest in "
                f"{longest['op']}, seq {int(longest['seq'])}): once, not per step"
            ),
            evidence={
                "wait_ms_per_rank": {str(int(r)): ms(float(v)) for r, v in per_rank.items()},
                "startup_wait_ms": ms(worst),
                "late_ranks": late,
                "longest_call": {
                    "op": str(longest["op"]),
                    "pg_name": str(longest["pg_name"]),
                    "seq": int(longest["seq"]),
                    "wait_ms": ms(float(longest["wait_ms"])),
                },
                "step_ms": ms(step_ms),
                "steps_equivalent": round(worst / step_ms, 1) if step_ms > 0 else None,
            },
            fix=STARTUP_WAIT_FIX,
        )
    ]


def run_startup_findings(run: Run | None, step_by_rank: dict[int, float]) -> list[Finding]:
    """The start-up wait finding of a gpudiag run (none for foreign traces)."""
    if run is None:
        return []
    steps = [v for v in step_by_rank.values() if v > 0]
    step_ms = float(np.median(steps)) if steps else 0.0
    return startup_wait_findings(startup_waits(run.collectives, run.steps), step_ms)
