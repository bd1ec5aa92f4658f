"""The run's steady step time, and where each rank's steady steps go on its CPU.

Read from the run's steps table (every step the run recorded, not only the profiled
window, which the profiler slows: docs/findings.md "Severity"):

* the **steady step time**: the median step over the steps every rank completed, after
  warm-up (:data:`WARMUP_SHARE` of them, at least the first, at most :data:`WARMUP_MAX`);
* per rank, from the training thread's scheduler counters (``cpu_ns``, ``runq_ns``,
  capture/steps.py): the time per step on a CPU, **runnable but waiting for a CPU** (the
  run queue: other processes or the rank's own threads held the cores) and off the CPU
  (sleeping or blocked: waiting for data, peers, I/O, a ``time.sleep``).

A rank whose extra time is run-queue delay was *starved*; one whose extra time is on the
CPU or off it was slow by itself (stragglers: straggler_findings.straggler_findings).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# Warm-up: this share of a run's completed steps (at least the first step of a run of 3
# or more, at most WARMUP_MAX steps) is left out of the steady figures.
WARMUP_SHARE = 0.1
WARMUP_MAX = 5


@dataclass(frozen=True)
class RankTime:
    """One rank's median per steady step (ms); ``cpu_ms`` / ``runq_ms`` None where the
    steps table has no scheduler counters (not Linux, or an older run)."""

    rank: int
    steps: int
    step_ms: float
    data_ms: float
    cpu_ms: float | None
    runq_ms: float | None
    # mean over its steady steps of the training thread's run-queue share of the step
    runq_share: float | None = None
    # the run-queue delay of all its threads together (intra-op workers, gloo's, the
    # loader's pin thread): summed over threads, so an upper bound on what it costs the step
    threads_runq_ms: float | None = None

    @property
    def off_cpu_ms(self) -> float | None:
        """Sleeping or blocked: the step minus its time on a CPU and in the run queue."""
        if self.cpu_ms is None or self.runq_ms is None:
            return None
        return max(self.step_ms - self.cpu_ms - self.runq_ms, 0.0)


def steady_steps(steps: pd.DataFrame | None) -> pd.DataFrame:
    """The rows of the steps every rank completed, after warm-up (empty when none)."""
    if steps is None or steps.empty or not {"rank", "step", "start_ns", "end_ns"} <= set(steps):
        return pd.DataFrame(columns=["rank", "step", "step_ms"])
    rows = steps.dropna(subset=["start_ns", "end_ns"])
    n_ranks = rows["rank"].nunique()
    per_step = rows.groupby("step")["rank"].nunique()
    done = np.sort(per_step.index[per_step.to_numpy() >= n_ranks].to_numpy())
    warmup = warmup_step_count(steps)
    kept = rows[rows["step"].isin(done[warmup:])]
    # subtracted as integers: epoch ns as floats lose the last ~256 ns
    step_ms = (kept["end_ns"].astype("int64") - kept["start_ns"].astype("int64")) / 1e6
    return kept.assign(step_ms=step_ms)


def steady_step_ms(steps: pd.DataFrame | None) -> float | None:
    """Median step (ms) over every rank's steady steps; None without a steps table."""
    rows = steady_steps(steps)
    if rows.empty:
        return None
    value = float(np.median(rows["step_ms"].to_numpy()))
    return value if value > 0 else None


# The host's step is shorter than the GPU's busy time per step by more than this: the
# host ran ahead of the GPU, queueing kernels without waiting (no sync in the step).
HOST_AHEAD_RATIO = 1.2


def gpu_busy_floor_ms(breakdown: pd.DataFrame, gpu_ranks: set[int]) -> float | None:
    """Median GPU-busy time per profiled step (compute, copies and exposed communication
    on the GPU) over the ranks whose traces hold GPU events: no step is shorter than
    that. None without such ranks. A step that never waits for the GPU ends on the host
    while its kernels still queue (seen on an H200: 2.0 ms host steps of a 14.0 ms GPU
    step), so the host's step times alone can understate the step."""
    if breakdown is None or breakdown.empty or not gpu_ranks:
        return None
    rows = breakdown[breakdown["rank"].isin(sorted(gpu_ranks))]
    if rows.empty:
        return None
    busy = (rows["compute"] + rows["comm_exposed"]).to_numpy(dtype=float)
    value = float(np.median(busy))
    return value if value > 0 else None


def gpu_bounded_step_ms(
    host_ms: float | None, breakdown: pd.DataFrame, gpu_ranks: set[int]
) -> tuple[float | None, bool]:
    """The steady step: the host's median, or the GPU's busy time per step
    (:func:`gpu_busy_floor_ms`) where the host's is shorter by more than HOST_AHEAD_RATIO
    (the host ran ahead of the GPU); and whether it is the GPU's."""
    floor = gpu_busy_floor_ms(breakdown, gpu_ranks)
    if host_ms is None or floor is None or floor <= host_ms * HOST_AHEAD_RATIO:
        return host_ms, False
    return floor, True


def warmup_step_count(steps: pd.DataFrame | None) -> int:
    """How many of the steps every rank completed the steady window leaves out as warm-up
    (none when fewer than 3 were completed: there is nothing to spare)."""
    if steps is None or steps.empty or not {"rank", "step", "start_ns", "end_ns"} <= set(steps):
        return 0
    rows = steps.dropna(subset=["start_ns", "end_ns"])
    per_step = rows.groupby("step")["rank"].nunique()
    done = int((per_step >= rows["rank"].nunique()).sum())
    return min(max(int(round(WARMUP_SHARE * done)), 1), WARMUP_MAX) if done >= 3 else 0


def steady_step_count(steps: pd.DataFrame | None) -> int:
    """How many distinct steady steps the run has (0 without a steps table)."""
    rows = steady_steps(steps)
    return int(rows["step"].nunique()) if len(rows) else 0


def rank_times(steps: pd.DataFrame | None) -> dict[int, RankTime]:
    """Per rank, the median over its steady steps of its step, data wait and scheduler
    figures (medians: one step that took a profiler's export, or a descheduled one,
    does not move them)."""
    rows = steady_steps(steps)
    out: dict[int, RankTime] = {}
    for rank, part in rows.groupby("rank"):
        out[int(rank)] = RankTime(
            rank=int(rank),
            steps=len(part),
            step_ms=float(part["step_ms"].median()),
            data_ms=_mean_ms(part, "data_ns") or 0.0,
            cpu_ms=_mean_ms(part, "cpu_ns"),
            runq_ms=_mean_ms(part, "runq_ns"),
            runq_share=_runq_share(part),
            threads_runq_ms=_mean_ms(part, "threads_runq_ns"),
        )
    return out


def _mean_ms(part: pd.DataFrame, column: str) -> float | None:
    if column not in part:
        return None
    values = pd.to_numeric(part[column], errors="coerce")
    if values.isna().all():
        return None
    return float(values.fillna(0).median()) / 1e6


def _runq_share(part: pd.DataFrame) -> float | None:
    """Mean over the steps of run-queue delay / step (each at most 1: a step shortened by
    a profiler's export keeps the delay the export had)."""
    if "runq_ns" not in part:
        return None
    runq = pd.to_numeric(part["runq_ns"], errors="coerce") / 1e6
    if runq.isna().all():
        return None
    share = (runq / part["step_ms"].where(part["step_ms"] > 0)).clip(upper=1.0)
    return float(share.mean()) if share.notna().any() else None


def runq_share(times: dict[int, RankTime]) -> float | None:
    """The median rank's share of its steps spent runnable but waiting for a CPU (its
    training thread's run queue, the mean over its steady steps: descheduled bursts
    count): how much of the job's time the host's other processes took (None without
    the counters)."""
    shares = [t.runq_share for t in times.values() if t.runq_share is not None]
    return float(np.median(shares)) if shares else None


def runq_per_step(times: dict[int, RankTime]) -> tuple[dict[int, float], float | None]:
    """Each rank's training thread's mean run-queue wait per steady step (ms: its share
    times its step), and the median rank's share (:func:`runq_share`)."""
    per_rank = {r: t.runq_share * t.step_ms for r, t in times.items() if t.runq_share is not None}
    return per_rank, runq_share(times)


def median_runq_ms(times: dict[int, RankTime]) -> float | None:
    """The median rank's run-queue delay per steady step (ms), None without counters."""
    values = [t.runq_ms for t in times.values() if t.runq_ms is not None]
    return float(np.median(values)) if values else None
