"""Data loading and host stalls: how long each step waits for its batch, how long the
GPU sits idle meanwhile, and the host synchronisation points inside the step.

Two sources: the trace's ``dataloader`` events (DataLoader ``__next__``, profiled window
only) and the run directory's steps table ``data_ns`` (every step of the run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis.findings import Finding, ms, severity_for
from gpudiag.analysis.jsonable import rows_of, whole

DATALOADER_FIX = (
    "Load batches in parallel and ahead of the GPU: DataLoader(num_workers=4..8, "
    "pin_memory=True, persistent_workers=True, prefetch_factor=2..4), move the batch with "
    ".to(device, non_blocking=True), and do heavy per-sample transforms once, offline."
)
HOST_SYNC_FIX = (
    "Remove per-step host synchronisation: keep losses/metrics on the device and call "
    ".item()/.cpu()/print only every N steps; avoid torch.cuda.synchronize() and "
    "data-dependent Python control flow on tensor values inside the step."
)


@dataclass(frozen=True, slots=True)
class TraceDataWait:
    """One rank's DataLoader wait in its profiled window (trace ``dataloader`` events)."""

    rank: int
    events: int
    steps: int
    data_ms_per_step: float
    data_ms_max_step: float
    gpu_idle_waiting_ms_per_step: float | None  # None without GPU events


@dataclass(frozen=True)
class RunDataWait:
    """One rank's data wait over every step of the run (steps table ``data_ns``); the
    summaries-only path knows only the mean, so the rest may be None."""

    steps: int | None
    data_ms_per_step: float
    data_ms_max_step: float | None
    step_ms_mean: float | None


@dataclass(frozen=True)
class SyncCalls:
    count: int
    total_ms: float


@dataclass(frozen=True, slots=True)
class HostSync:
    """One rank's host synchronisation points inside the profiled steps."""

    rank: int
    count_per_step: float
    # the cost: GPU idle time the syncs cause (0 on CPU-only traces)
    ms_per_step: float
    by_name: dict[str, SyncCalls]
    # how long the host blocks in them (not a cost: the GPU may be busy meanwhile)
    host_blocking_ms_per_step: float = 0.0
    gpu_trace: bool = False


@dataclass(frozen=True)
class DataLoaderResult:
    trace: tuple[TraceDataWait, ...] = ()
    run: dict[int, RunDataWait] = field(default_factory=dict)
    host_sync: tuple[HostSync, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return whole(self.json_rows())

    def json_rows(self) -> dict[str, Any]:
        """:meth:`to_json` with its per-rank lists as jsonable.Rows (made as written)."""
        return {
            "trace": rows_of(self.trace, asdict),
            "run": {str(rank): asdict(row) for rank, row in self.run.items()},
            "host_sync": rows_of(self.host_sync, asdict),
        }


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals, vectorised (sort, running max, split on gaps)."""
    if len(starts) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.int64)[order]
    e = np.asarray(ends, dtype=np.int64)[order]
    run_end = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new_group) - 1
    merged_s = s[new_group]
    merged_e = np.zeros(len(merged_s), dtype=np.int64)
    np.maximum.at(merged_e, group, run_end)
    return merged_s, merged_e


def overlap_ns(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> int:
    """Total length of the intersection of two unions of intervals (each already merged)."""
    if len(a_s) == 0 or len(b_s) == 0:
        return 0
    points = np.concatenate([a_s, a_e, b_s, b_e])
    deltas = np.concatenate(
        [np.ones(len(a_s)), -np.ones(len(a_e)), np.full(len(b_s), 2), np.full(len(b_e), -2)]
    ).astype(np.int64)
    order = np.lexsort((deltas, points))
    points, deltas = points[order], deltas[order]
    state = np.cumsum(deltas)
    both = state[:-1] == 3
    return int(np.sum(np.diff(points)[both]))


def _step_of(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step number containing each time (-1 outside every step)."""
    if steps is None or steps.empty or len(times) == 0:
        return np.full(len(times), -1, dtype=np.int64)
    st = steps.sort_values("start_ns")
    starts = st["start_ns"].to_numpy(np.int64)
    ends = st["end_ns"].to_numpy(np.int64)
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    out = np.full(len(times), -1, dtype=np.int64)
    out[ok] = st["step"].to_numpy(np.int64)[idx[ok]]
    return out


def _per_step_union_ms(events: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """ms per step covered by the union of the events (nested events counted once)."""
    if events.empty:
        return pd.Series(dtype=float)
    s, e = merge_intervals(events["start_ns"].to_numpy(), events["end_ns"].to_numpy())
    step = _step_of(s, steps)
    frame = pd.DataFrame({"step": step, "dur": (e - s) / 1e6})
    return frame[frame["step"] >= 0].groupby("step")["dur"].sum()


_GPU_WORK = ["compute", "comm", "memcpy", "memset"]


def trace_dataloader(trace: Any) -> TraceDataWait:
    """Per-rank DataLoader wait and GPU idle during it, from one RankTrace (cached on it)."""
    wait = trace.cached("dataloader", lambda: _trace_dataloader(trace))
    return replace(wait, rank=int(trace.meta.rank))


def _trace_dataloader(trace: Any) -> TraceDataWait:
    ev = trace.events
    steps = trace.steps
    n_steps = int(len(steps)) if steps is not None else 0
    dl = ev[ev["kind"] == "dataloader"]
    per_step = _per_step_union_ms(dl, steps)
    gpu = ev["is_gpu"].to_numpy(dtype=bool) & ev["kind"].isin(_GPU_WORK).to_numpy()
    gpu_idle_ms = 0.0
    if not dl.empty and gpu.any():
        ds, de = merge_intervals(dl["start_ns"].to_numpy(), dl["end_ns"].to_numpy())
        gs, ge = merge_intervals(ev["start_ns"].to_numpy()[gpu], ev["end_ns"].to_numpy()[gpu])
        gpu_idle_ms = (int(np.sum(de - ds)) - overlap_ns(ds, de, gs, ge)) / 1e6
    return TraceDataWait(
        rank=int(trace.meta.rank),
        events=int(len(dl)),
        steps=n_steps,
        data_ms_per_step=float(per_step.sum() / n_steps) if n_steps else 0.0,
        data_ms_max_step=float(per_step.max()) if len(per_step) else 0.0,
        gpu_idle_waiting_ms_per_step=gpu_idle_ms / n_steps if n_steps and gpu.any() else None,
    )


def _gpu_idle_caused(ev: pd.DataFrame, sync: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """GPU idle time the syncs cause, as merged intervals: a GPU idle gap that begins
    while the host blocks in a sync (the GPU finished the work the host waited for, and
    its queue is now empty), from its beginning until the GPU works again or the host
    makes its first runtime call (the next launch or copy) after the sync returns,
    whichever comes first. A gap already running when the sync began was not caused by
    it (the host was already behind); a sync while the GPU stays busy costs nothing."""
    empty = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    kinds = ev["kind"].isin(["compute", "comm", "memcpy", "memset"]).to_numpy()
    gpu_mask = ev["is_gpu"].to_numpy(dtype=bool) & kinds
    if sync.empty or not gpu_mask.any():
        return empty
    gs, ge = merge_intervals(ev["start_ns"].to_numpy()[gpu_mask], ev["end_ns"].to_numpy()[gpu_mask])
    ss, se = merge_intervals(sync["start_ns"].to_numpy(), sync["end_ns"].to_numpy())
    launches = np.sort(
        ev["start_ns"].to_numpy(dtype=np.int64)[(ev["kind"] == "runtime").to_numpy()]
    )
    nxt = np.searchsorted(launches, se, side="left")
    next_call = np.where(nxt < len(launches), launches[np.minimum(nxt, len(launches) - 1)], se)
    # idle gaps between busy intervals: (ge[i], gs[i + 1]); the last one has no end
    gap_s = ge
    gap_e = np.append(gs[1:], np.iinfo(np.int64).max)
    # the sync during whose blocking each gap begins
    owner = np.searchsorted(ss, gap_s, side="right") - 1
    ok = (owner >= 0) & (gap_s < se[np.maximum(owner, 0)])
    if not ok.any():
        return empty
    o = owner[ok]
    start = gap_s[ok]
    end = np.minimum(gap_e[ok], np.maximum(next_call[o], se[o]))
    keep = end > start
    return merge_intervals(start[keep], end[keep])


def trace_host_sync(trace: Any) -> HostSync:
    """Host syncs inside the steps. ``host_blocking_ms_per_step`` is how long the host
    waits in them; ``ms_per_step`` (the cost) is the GPU idle time they cause (see
    :func:`_gpu_idle_caused`): zero on a CPU-only trace, where a sync costs nothing.
    Cached on the trace."""
    sync = trace.cached("host_sync", lambda: _trace_host_sync(trace))
    return replace(sync, rank=int(trace.meta.rank))


def _trace_host_sync(trace: Any) -> HostSync:
    ev = trace.events
    steps = trace.steps
    n_steps = int(len(steps)) if steps is not None and len(steps) else 0
    sync = ev[(ev["kind"] == "sync") & (ev["step"] >= 0)] if n_steps else ev[ev["kind"] == "sync"]
    by_name = sync.groupby("name", observed=True)["dur_ns"].agg(["count", "sum"])
    blocking_ms = _per_step_union_ms(sync, steps).sum() if n_steps else sync["dur_ns"].sum() / 1e6
    is_gpu = bool(
        (ev["is_gpu"].to_numpy(dtype=bool) & ev["kind"].isin(["compute", "comm"]).to_numpy()).any()
    )
    idle_ms = 0.0
    if is_gpu and len(sync):
        s, e = _gpu_idle_caused(ev, sync)
        if n_steps:
            step = _step_of(s, steps)
            idle_ms = float(((e - s)[step >= 0]).sum() / 1e6)
        else:
            idle_ms = float((e - s).sum() / 1e6)
    return HostSync(
        rank=int(trace.meta.rank),
        count_per_step=float(len(sync) / n_steps) if n_steps else float(len(sync)),
        ms_per_step=idle_ms / n_steps if n_steps else 0.0,
        host_blocking_ms_per_step=float(blocking_ms / n_steps) if n_steps else 0.0,
        gpu_trace=is_gpu,
        by_name={
            str(name): SyncCalls(count=int(row["count"]), total_ms=float(row["sum"] / 1e6))
            for name, row in by_name.iterrows()
        },
    )


def run_dataloader(run: Any) -> dict[int, RunDataWait]:
    """Per rank mean/max data wait over every step of the run (steps table data_ns)."""
    steps = getattr(run, "steps", None)
    if steps is None or steps.empty or "data_ns" not in steps.columns:
        return {}
    data = steps.dropna(subset=["data_ns"])
    out: dict[int, RunDataWait] = {}
    for rank, g in data.groupby("rank"):
        step_ns = (g["end_ns"] - g["start_ns"]).astype(float)
        out[int(rank)] = RunDataWait(
            steps=int(len(g)),
            data_ms_per_step=float(g["data_ns"].astype(float).mean() / 1e6),
            data_ms_max_step=float(g["data_ns"].astype(float).max() / 1e6),
            step_ms_mean=float(step_ns.mean() / 1e6),
        )
    return out


def analyze_dataloader(traces: list[Any], run: Any | None) -> DataLoaderResult:
    return DataLoaderResult(
        trace=tuple(trace_dataloader(t) for t in traces),
        run=run_dataloader(run) if run is not None else {},
        host_sync=tuple(trace_host_sync(t) for t in traces),
    )


def dataloader_findings(info: DataLoaderResult, step_ms: dict[int, float]) -> list[Finding]:
    """dataloader_stall from the whole-run steps table when present (it covers every
    step), else from the profiled window."""
    per_rank: dict[int, float] = {}
    source = "run steps table (every step)"
    for rank, row in info.run.items():
        per_rank[rank] = row.data_ms_per_step
    if not per_rank:
        source = "trace DataLoader events (profiled window)"
        per_rank = {r.rank: r.data_ms_per_step for r in info.trace if r.steps}
    if not per_rank:
        return []
    cost = float(np.mean(list(per_rank.values())))
    mean_step = float(np.mean([step_ms.get(r, np.nan) for r in per_rank]))
    severity = severity_for(cost, mean_step)
    if severity is None:
        return []
    ranks = [r for r, v in per_rank.items() if severity_for(v, step_ms.get(r, mean_step))]
    idle = [
        r.gpu_idle_waiting_ms_per_step
        for r in info.trace
        if r.gpu_idle_waiting_ms_per_step is not None
    ]
    evidence = {
        "data_ms_per_step": ms(cost),
        "step_ms": ms(mean_step),
        "share_of_step": round(cost / mean_step, 3),
        "per_rank_data_ms": {str(r): ms(v) for r, v in sorted(per_rank.items())},
        "source": source,
    }
    if idle:
        evidence["gpu_idle_waiting_ms_per_step"] = ms(float(np.mean(idle)))
    return [
        Finding(
            kind="dataloader_stall",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=sorted(ranks),
            title=f"Steps wait {cost:.1f} ms for data ({100 * cost / mean_step:.0f}% of the step)",
            evidence=evidence,
            fix=DATALOADER_FIX,
        )
    ]


def host_sync_findings(info: DataLoaderResult, step_ms: dict[int, float]) -> list[Finding]:
    rows = [r for r in info.host_sync if r.ms_per_step > 0]
    if not rows:
        return []
    cost = float(np.mean([r.ms_per_step for r in rows]))
    mean_step = float(np.mean([step_ms.get(r.rank, np.nan) for r in rows]))
    severity = severity_for(cost, mean_step)
    if severity is None:
        return []
    names: dict[str, int] = {}
    for r in rows:
        for name, v in r.by_name.items():
            names[name] = names.get(name, 0) + v.count
    blocking = float(np.mean([r.host_blocking_ms_per_step for r in rows]))
    return [
        Finding(
            kind="host_sync",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=sorted(r.rank for r in rows),
            title=(
                f"Host synchronisation leaves the GPU idle {cost:.1f} ms per step "
                f"(the host blocks {blocking:.1f} ms in it)"
            ),
            evidence={
                "gpu_idle_caused_ms_per_step": ms(cost),
                "host_blocking_ms_per_step": ms(blocking),
                "step_ms": ms(mean_step),
                "sync_points_per_step": round(float(np.mean([r.count_per_step for r in rows])), 2),
                "calls": names,
            },
            fix=HOST_SYNC_FIX,
        )
    ]
