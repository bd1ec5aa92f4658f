"""Data loading and host stalls: how long each step waits for its batch, how long the
GPU sits idle meanwhile, and the host synchronisation points inside the step.

Two sources: the trace's ``dataloader`` events (DataLoader ``__next__``, profiled window
only; a trace without ProfilerStep marks is one window over its events, as in the
breakdown) and the run directory's steps table ``data_ns`` (every step of the run).

A one-off start-up wait (the first step waiting seconds for DataLoader workers to start)
is set apart (``startup_ms``), never averaged into the per-step wait: see
:func:`startup_split`. A wait on some ranks only is reported for those ranks, with their
own ms per step, not the mean over every rank.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import intervals as iv
from gpudiag.analysis.breakdown import step_windows
from gpudiag.analysis.findings import LOW_SHARE, Finding, host_load_weight, ms, severity_for
from gpudiag.analysis.jsonable import rows_of, whole
from gpudiag.analysis.trace_model import outermost_calls
from gpudiag.numfmt import ms_text, pct_text, plural

DATALOADER_FIX = (
    "Load batches in parallel and ahead of the GPU: DataLoader(num_workers=4..8, "
    "pin_memory=True, persistent_workers=True, prefetch_factor=2..4), move the batch with "
    ".to(device, non_blocking=True), and do heavy per-sample transforms once, offline."
)
# Cores per rank below this: more loader workers than that compete with the training
# threads for the cores (probe 29h: 2 cores, 2 ranks of 2 workers each, told
# "num_workers=4..8", and 4 workers waited longer: 3.1 ms against 2.4-2.7 ms).
FEW_CORES_PER_RANK = 4
DATALOADER_FIX_FEW_CORES = (
    "This host has {cores} for {ranks} ({per} per rank): loader workers beyond that compete "
    "with the training threads for the cores, so more of them may not help. Make each batch "
    "cheaper to load (pre-process offline, lighter per-sample transforms, a larger batch "
    "per load), keep pin_memory=True and .to(device, non_blocking=True), or run the job "
    "where each rank has more cores."
)


def _far_above_the_rest(per_rank: dict[int, float], step_ms: float) -> list[int]:
    """The ranks whose data wait is far above the others' (the longest at least 3x the
    shortest, by 2 % of the step or more; those above the midpoint): their own wait, not a
    mean over every rank. Rank 1's workers sleeping 80 ms per batch waited 15.6 ms per step
    against rank 0's 2.7 ms, and the finding said "ranks 0 and 1: 9.1 ms", then put it down
    to the host's CPU (probe 29h, class 3)."""
    if len(per_rank) < 2 or not np.isfinite(step_ms):
        return []
    low, high = min(per_rank.values()), max(per_rank.values())
    if high < 3 * low or high - low < LOW_SHARE * step_ms:
        return []
    return sorted(r for r, v in per_rank.items() if v > (low + high) / 2)


def fit_loader_advice(
    findings: list[Finding], cores_per_node: int | None, world_size: int | None, nodes: int
) -> None:
    """A dataloader_stall's fix where each rank has fewer than :data:`FEW_CORES_PER_RANK`
    cores and a quarter of the wait or more is put down to the host's load (evidence
    ``host_load_part_ms``: the loader is short of CPU): not more workers
    (:data:`DATALOADER_FIX_FEW_CORES`). A wait the CPU shortage does not explain (a
    sleeping or I/O-bound dataset) keeps the advice: more workers overlap it."""
    if not cores_per_node or not world_size or nodes < 1:
        return
    ranks = -(-world_size // nodes)  # per node, the fullest
    per = cores_per_node / ranks
    if per >= FEW_CORES_PER_RANK:
        return
    for i, f in enumerate(findings):
        host = f.evidence.get("host_load_part_ms") or 0.0
        if (
            f.kind == "dataloader_stall"
            and f.fix == DATALOADER_FIX
            and host >= 0.25 * f.cost_ms_per_step
        ):
            fix = DATALOADER_FIX_FEW_CORES.format(
                cores=plural(cores_per_node, "core"),
                ranks=plural(ranks, "rank"),
                per=f"{per:g}",
            )
            findings[i] = replace(f, fix=fix, evidence={**f.evidence, "cores_per_rank": per})


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
    # the first profiled step's one-off wait, set apart from the per-step wait (None: none)
    startup_ms: float | None = None
    # no ProfilerStep marks: the whole trace is one window (``steps`` is then 1)
    whole_trace: bool = False


@dataclass(frozen=True)
class RunDataWait:
    """One rank's data wait over every step of the run (steps table ``data_ns``); the
    summaries-only path knows only the mean, so the rest may be None."""

    steps: int | None
    data_ms_per_step: float
    data_ms_max_step: float | None
    step_ms_mean: float | None
    # the first step's one-off wait (workers starting), set apart from the per-step wait
    startup_ms: float | None = None


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


def _window_of(times: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    """Row position (in start order) of the step window containing each time, -1 outside
    every window."""
    if steps is None or steps.empty or len(times) == 0:
        return np.full(len(times), -1, dtype=np.int64)
    st = steps.sort_values("start_ns")
    starts = st["start_ns"].to_numpy(np.int64)
    ends = st["end_ns"].to_numpy(np.int64)
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _step_of(times: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    """Step number containing each time (-1 outside every step)."""
    pos = _window_of(times, steps)
    out = np.full(len(times), -1, dtype=np.int64)
    if steps is not None and len(steps) and (pos >= 0).any():
        numbers = steps.sort_values("start_ns")["step"].to_numpy(np.int64)
        out[pos >= 0] = numbers[pos[pos >= 0]]
    return out


def _per_step_union_ms(events: pd.DataFrame, steps: pd.DataFrame | None) -> pd.Series:
    """ms per step window covered by the union of the events (nested events counted
    once), indexed by step number (-1: a trace without ProfilerStep marks). An event that
    crosses a window's edge counts for the part inside it, as the breakdown counts it (a
    DataLoader ``__next__`` begun just before its step's ProfilerStep counted 0 here and
    1.0 ms in the breakdown: browser probe of issue 31, DLRM rank 3)."""
    if events.empty or steps is None or steps.empty:
        return pd.Series(dtype=float)
    s, e = iv.intersect(
        iv.union(events["start_ns"].to_numpy(), events["end_ns"].to_numpy()),
        iv.union(steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()),
    )
    pos = _window_of(s, steps)
    numbers = steps.sort_values("start_ns")["step"].to_numpy(np.int64)
    inside = pos >= 0
    frame = pd.DataFrame({"step": numbers[pos[inside]], "dur": (e - s)[inside] / 1e6})
    return frame.groupby("step")["dur"].sum()


# A first step whose data wait is this many times the longest wait of every later step
# (and at least STARTUP_MIN_NS longer) waited for the loader to start: a one-off.
STARTUP_FACTOR = 3.0
STARTUP_MIN_NS = 10_000_000


def startup_split(waits_ns: np.ndarray) -> tuple[float | None, np.ndarray]:
    """(start-up wait in ms or None, the per-step waits in ns without it), from one rank's
    data wait per step in step order. The first step's wait is start-up when at least two
    later steps exist and it exceeds STARTUP_FACTOR x the longest of them by at least
    STARTUP_MIN_NS: the DataLoader's workers starting (torchvision imagenet with
    ``-j 2``: 5.4 s at step 0, at most 10 ms after). Each worker delivers its first batch
    once it has started, and on a loaded host the workers start one after another: the
    next steps' waits are start-up too while each is as far above every later one (at most
    half the steps). A wait that recurs is per-step."""
    waits = np.asarray(waits_ns, dtype=float)
    leading = _leading_startup_steps(waits)
    if not leading:
        return None, waits
    return float(np.sum(waits[:leading])) / 1e6, waits[leading:]


def _leading_startup_steps(waits: np.ndarray) -> int:
    if len(waits) < 3:
        return 0
    # the longest wait after each step: suffix maxima
    later = np.maximum.accumulate(waits[::-1])[::-1]
    leading = 0
    while leading < len(waits) // 2:
        wait, rest = float(waits[leading]), float(later[leading + 1])
        if wait < STARTUP_FACTOR * rest or wait - rest < STARTUP_MIN_NS:
            break
        leading += 1
    return leading


_GPU_WORK = ["compute", "comm", "memcpy", "memset"]


def trace_dataloader(trace: Any) -> TraceDataWait:
    """Per-rank DataLoader wait and GPU idle during it, from one RankTrace (cached on it)."""
    wait = trace.cached("dataloader", lambda: _trace_dataloader(trace))
    return replace(wait, rank=int(trace.meta.rank))


def _trace_dataloader(trace: Any) -> TraceDataWait:
    ev = trace.events
    # the breakdown's windows: the ProfilerSteps, else the whole trace as one window
    windows = step_windows(trace)
    n_steps = int(len(windows))
    dl = ev[ev["kind"] == "dataloader"]
    per_step = _per_step_union_ms(dl, windows).reindex(windows["step"], fill_value=0.0)
    startup, waits = startup_split(per_step.to_numpy(dtype=float) * 1e6)
    counted = len(waits)
    set_apart = n_steps - counted
    gpu = ev["is_gpu"].to_numpy(dtype=bool) & ev["kind"].isin(_GPU_WORK).to_numpy()
    gpu_idle_ms = 0.0
    if not dl.empty and gpu.any():
        # the waits inside the counted windows (the start-up steps' are not a per-step cost)
        counted_windows = windows.iloc[set_apart:]
        ds, de = iv.intersect(
            iv.union(dl["start_ns"].to_numpy(), dl["end_ns"].to_numpy()),
            iv.union(counted_windows["start_ns"].to_numpy(), counted_windows["end_ns"].to_numpy()),
        )
        gs, ge = merge_intervals(ev["start_ns"].to_numpy()[gpu], ev["end_ns"].to_numpy()[gpu])
        gpu_idle_ms = (int(np.sum(de - ds)) - overlap_ns(ds, de, gs, ge)) / 1e6
    return TraceDataWait(
        rank=int(trace.meta.rank),
        events=int(len(dl)),
        steps=n_steps,
        data_ms_per_step=float(waits.sum() / 1e6 / counted) if counted else 0.0,
        data_ms_max_step=float(waits.max() / 1e6) if counted else 0.0,
        gpu_idle_waiting_ms_per_step=gpu_idle_ms / counted if counted and gpu.any() else None,
        startup_ms=startup,
        whole_trace=n_steps > 0 and not len(trace.steps),
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
    # the breakdown's windows: the ProfilerSteps, else the whole trace as one window
    # (357 cudaEventSynchronize calls in a trace without steps are still syncs)
    windows = step_windows(trace)
    n_steps = int(len(windows))
    in_window = _window_of(ev["start_ns"].to_numpy(dtype=np.int64), windows) >= 0
    sync = ev[(ev["kind"] == "sync").to_numpy() & in_window]
    by_name = sync.groupby("name", observed=True)["dur_ns"].agg(["count", "sum"])
    blocking_ms = float(_per_step_union_ms(sync, windows).sum()) if n_steps else 0.0
    is_gpu = bool(
        (ev["is_gpu"].to_numpy(dtype=bool) & ev["kind"].isin(["compute", "comm"]).to_numpy()).any()
    )
    idle_ms = 0.0
    if is_gpu and len(sync):
        s, e = _gpu_idle_caused(ev, sync)
        idle_ms = float(((e - s)[_window_of(s, windows) >= 0]).sum() / 1e6)
    return HostSync(
        rank=int(trace.meta.rank),
        count_per_step=float(len(outermost_calls(sync)) / n_steps) if n_steps else 0.0,
        ms_per_step=idle_ms / n_steps if n_steps else 0.0,
        host_blocking_ms_per_step=blocking_ms / n_steps if n_steps else 0.0,
        gpu_trace=is_gpu,
        by_name={
            str(name): SyncCalls(count=int(row["count"]), total_ms=float(row["sum"] / 1e6))
            for name, row in by_name.iterrows()
        },
    )


def run_dataloader(run: Any) -> dict[int, RunDataWait]:
    """Per rank mean/max data wait over every step of the run (steps table data_ns), the
    first steps' one-off start-up wait set apart (:func:`startup_split`)."""
    steps = getattr(run, "steps", None)
    if steps is None or steps.empty or "data_ns" not in steps.columns:
        return {}
    data = steps.dropna(subset=["data_ns"])
    if "step" in data.columns:
        data = data.sort_values(["rank", "step"], kind="stable")
    out: dict[int, RunDataWait] = {}
    for rank, g in data.groupby("rank"):
        step_ns = (g["end_ns"] - g["start_ns"]).astype(float).to_numpy()
        startup, waits = startup_split(g["data_ns"].astype(float).to_numpy())
        step_ns = step_ns[len(step_ns) - len(waits) :]
        out[int(rank)] = RunDataWait(
            steps=int(len(waits)),
            data_ms_per_step=float(waits.mean() / 1e6),
            data_ms_max_step=float(waits.max() / 1e6),
            step_ms_mean=float(step_ns.mean() / 1e6),
            startup_ms=startup,
        )
    return out


def analyze_dataloader(traces: list[Any], run: Any | None) -> DataLoaderResult:
    return DataLoaderResult(
        trace=tuple(trace_dataloader(t) for t in traces),
        run=run_dataloader(run) if run is not None else {},
        host_sync=tuple(trace_host_sync(t) for t in traces),
    )


# A first-batch wait is worth a (one-off, low) finding from this many ms, and this many
# steady steps: below, it is start-up noise.
STARTUP_MIN_MS = 100.0
STARTUP_MIN_STEPS = 5.0
STARTUP_FIX = (
    "Paid once per DataLoader iterator: keep the workers between epochs "
    "(persistent_workers=True; without it the wait comes back every epoch), keep the "
    "Dataset's __init__ and worker_init_fn light (open files lazily, in the worker), and "
    "use no more num_workers than the step needs."
)


def startup_findings(info: DataLoaderResult, step_ms: dict[int, float]) -> list[Finding]:
    """The first batch's one-off wait (DataLoader workers starting; :func:`startup_split`
    set it apart from the per-step wait): reported once, as start-up, low, with no
    per-step cost: it is not paid again per step (per epoch without persistent_workers)."""
    if info.run:
        startup = {r: w.startup_ms for r, w in info.run.items() if w.startup_ms is not None}
    else:
        startup = {w.rank: w.startup_ms for w in info.trace if w.startup_ms is not None}
    if not startup:
        return []
    worst = max(startup.values())
    steps = [v for v in step_ms.values() if v > 0]
    step = float(np.median(steps)) if steps else 0.0
    if worst < STARTUP_MIN_MS or (step > 0 and worst < STARTUP_MIN_STEPS * step):
        return []
    ranks = sorted(r for r, v in startup.items() if v >= 0.5 * worst)
    per_rank = ", ".join(f"rank {r}: {startup[r] / 1000:.2f} s" for r in sorted(startup))
    return [
        Finding(
            kind="dataloader_startup",
            severity="low",
            cost_ms_per_step=0.0,
            ranks=ranks,
            title=(
                f"The first batch waited {worst / 1000:.2f} s for the DataLoader to start "
                f"({per_rank}): once, not per step"
            ),
            evidence={
                "startup_ms_per_rank": {str(r): ms(v) for r, v in sorted(startup.items())},
                "startup_ms": ms(worst),
                "step_ms": ms(step),
            },
            fix=STARTUP_FIX,
        )
    ]


# Part of a data wait put down to the host's load: the loader's workers queue for a CPU as
# the training threads do, so a wait no longer than the training threads' own run-queue
# wait may be the shortage of CPU, not the loader's settings.
_STARVED_LOADER_WORDS = (
    "; the ranks waited {share:.0%} of the step ({runq} ms) for a CPU (the cores were "
    "busy: other processes, or the job's own threads and workers), so loading the data was "
    "short of CPU too, and more loader workers may not give this back"
)


def _host_part(
    cost: float, ranks: list[int], runq_ms: dict[int, float] | None, runq_share: float | None
) -> tuple[float, float] | None:
    """The part of the named ranks' data wait (ms per step) put down to the host's load,
    and their mean run-queue wait per step; None without counters. All of a wait no
    longer than the run-queue wait, none of one twice as long or more, in proportion
    between; times findings.host_load_weight of the CPU-wait share. Continuous in both,
    so that repeats of one job do not flip severity at a threshold (probe 29h)."""
    if not runq_ms:
        return None
    waits = [runq_ms[r] for r in ranks if r in runq_ms and np.isfinite(runq_ms[r])]
    if not waits or cost <= 0:
        return None
    wait = float(np.mean(waits))
    if wait <= 0:
        return 0.0, wait
    explained = min(max(2.0 - cost / wait, 0.0), 1.0)
    return min(cost, wait) * explained * host_load_weight(runq_share), wait


def _same_host_part(
    per_rank: dict[int, float], waiting: list[int], runq_ms: dict[int, float] | None
) -> float:
    """The most of some ranks' data wait the host's load can explain when the other ranks,
    on the same host with the same loader, wait less: what those others wait, plus what
    the named ranks waited for a CPU beyond them. A shortage of CPU that all ranks share
    cannot make one rank's loader 40 ms slower than its peer's (issue 29: rank 1's collate
    sleeping 40 ms beside busy cores was put all down to the host, low, while rank 0 waited
    0.68 ms under the same load)."""
    others = [r for r in per_rank if r not in waiting]
    if not others:
        return float("inf")
    others_wait = float(np.mean([per_rank[r] for r in others]))
    if not runq_ms:
        return others_wait
    mine = [runq_ms[r] for r in waiting if r in runq_ms and np.isfinite(runq_ms[r])]
    theirs = [runq_ms[r] for r in others if r in runq_ms and np.isfinite(runq_ms[r])]
    extra = float(np.mean(mine)) - float(np.mean(theirs)) if mine and theirs else 0.0
    return others_wait + max(extra, 0.0)


def _stall_title(
    cost: float,
    mean_step: float,
    waiting: list[int],
    others_ms: float | None,
    whole_trace: bool,
) -> str:
    share = f"{pct_text(100 * cost / mean_step)}"
    if others_ms is not None:  # only these ranks wait
        many = len(waiting) > 1
        who = ", ".join(str(r) for r in waiting)
        return (
            f"Rank{'s' if many else ''} {who} wait{'' if many else 's'} {ms_text(cost)} ms per "
            f"step for data ({share} of the step; the other ranks {ms_text(others_ms)} ms)"
        )
    if whole_trace:
        return (
            f"Data loading takes {ms_text(cost)} ms of the {ms_text(mean_step)} ms traced ({share})"
        )
    return f"Steps wait {ms_text(cost)} ms for data ({share} of the step)"


def _basis(step_basis: str, ranks: int, run_steady: bool) -> str:
    """Which step dataloader_stall's share is of (evidence ``step_basis``, probe 31l, F2:
    "step of these ranks: 46.16 ms" said neither the statistic nor the steps):
    ``steady_median`` (each rank's median over its steady steps) or ``profiled_mean`` (its
    mean over the profiled steps), ``_of_ranks`` appended for the mean of several ranks';
    ``run_steady``: the run's steady step."""
    if run_steady:
        return "run_steady"
    return step_basis + ("_of_ranks" if ranks > 1 else "")


def dataloader_findings(
    info: DataLoaderResult,
    step_ms: dict[int, float],
    runq_ms: dict[int, float] | None = None,
    runq_share: float | None = None,
    run_step_ms: float | None = None,
    step_basis: str = "profiled_mean",
) -> list[Finding]:
    """dataloader_stall from the whole-run steps table when present (it covers every
    step), else from the profiled window (a trace without ProfilerStep marks: its whole
    span as one window). The cost is per step, the start-up wait set apart (evidence
    ``startup_ms_per_rank``). When only some ranks wait (rank 1's collate_fn sleeps), the
    finding names those ranks and costs their own wait, not the mean over every rank;
    ``per_rank_data_ms`` keeps every rank's wait (ms per step). ``runq_ms`` (each rank's
    training thread's mean run-queue wait per steady step) and ``runq_share`` (the median
    rank's share, steady.runq_share): on a loaded host the severity is rated on the part of
    the wait not put down to the host's load (:func:`_host_part`); where that part is half
    the wait or more, the title says so. Where every rank waits, the step is the run's
    steady step (``run_step_ms``), the one every view shows (probe 31h, D2).
    ``step_basis``: what ``step_ms`` is, said in the evidence (:func:`_basis`)."""
    per_rank: dict[int, float] = {}
    startup: dict[int, float] = {}
    source = "run steps table (every step)"
    for rank, row in info.run.items():
        per_rank[rank] = row.data_ms_per_step
        if row.startup_ms is not None:
            startup[rank] = row.startup_ms
    whole_trace = False
    if not per_rank:
        source = "trace DataLoader events (profiled window)"
        rows = [r for r in info.trace if r.steps]
        per_rank = {r.rank: r.data_ms_per_step for r in rows}
        startup = {r.rank: r.startup_ms for r in rows if r.startup_ms is not None}
        whole_trace = bool(rows) and all(r.whole_trace for r in rows)
        if whole_trace:
            source = "trace DataLoader events (whole trace: no ProfilerStep marks)"
    if not per_rank:
        return []
    all_step = float(np.mean([step_ms.get(r, np.nan) for r in per_rank]))
    hit = sorted(r for r, v in per_rank.items() if severity_for(v, step_ms.get(r, all_step)))
    hit = _far_above_the_rest(per_rank, all_step) or hit
    # some ranks only: their own wait (the others do not wait for data)
    waiting = hit if hit and len(hit) < len(per_rank) else sorted(per_rank)
    cost = float(np.mean([per_rank[r] for r in waiting]))
    specific = len(waiting) < len(per_rank)
    mean_step = float(np.mean([step_ms.get(r, np.nan) for r in waiting]))
    if not specific and run_step_ms:  # every rank waits: the run's one steady step
        mean_step = run_step_ms
    severity = severity_for(cost, mean_step)
    if severity is None:
        return []
    host = _host_part(cost, waiting, runq_ms, runq_share)
    host_ms, host_wait = host if host is not None else (0.0, None)
    if specific:
        host_ms = min(host_ms, _same_host_part(per_rank, waiting, runq_ms))
    severity = severity_for(cost - host_ms, mean_step) or "low"
    hedged = host_ms >= 0.5 * cost
    idle = [
        r.gpu_idle_waiting_ms_per_step
        for r in info.trace
        if r.gpu_idle_waiting_ms_per_step is not None and r.rank in waiting
    ]
    evidence: dict[str, Any] = {
        "data_ms_per_step": ms(cost),
        # the named ranks' own step when only they wait: another number than the run's
        # step, so another name (browser probe: "step" 14.81 here, 15.77 elsewhere)
        ("step_of_these_ranks_ms" if specific else "step_ms"): ms(mean_step),
        "step_basis": _basis(step_basis, len(waiting), not specific and bool(run_step_ms)),
        "share_of_step": round(cost / mean_step, 3),
        "per_rank_data_ms": {str(r): ms(v) for r, v in sorted(per_rank.items())},
        "source": source,
    }
    if len(waiting) < len(per_rank):
        evidence["rank_specific"] = True
        evidence["other_ranks_data_ms"] = ms(
            float(np.mean([v for r, v in per_rank.items() if r not in waiting]))
        )
    if startup:
        evidence["startup_ms_per_rank"] = {str(r): ms(v) for r, v in sorted(startup.items())}
    if idle:
        evidence["gpu_idle_waiting_ms_per_step"] = ms(float(np.mean(idle)))
    if host_ms > 0 and host_wait is not None and runq_share is not None:
        evidence["runq_ms_per_step"] = ms(host_wait)
        evidence["runq_share_of_step"] = round(runq_share, 3)
        evidence["host_load_part_ms"] = ms(host_ms)
    title = _stall_title(cost, mean_step, waiting, evidence.get("other_ranks_data_ms"), whole_trace)
    if hedged and host_wait is not None:
        title += _STARVED_LOADER_WORDS.format(share=runq_share, runq=ms_text(host_wait))
    return [
        Finding(
            kind="dataloader_stall",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=hit,
            title=title,
            evidence=evidence,
            fix=DATALOADER_FIX,
        )
    ]


def host_sync_findings(
    info: DataLoaderResult, step_ms: dict[int, float], run_step_ms: float | None = None
) -> list[Finding]:
    """host_sync per step; the step is the run's steady step (``run_step_ms``) where every
    rank syncs, as in every other finding (probe 31h: two steps of one run, D2)."""
    rows = [r for r in info.host_sync if r.ms_per_step > 0]
    if not rows:
        return []
    cost = float(np.mean([r.ms_per_step for r in rows]))
    mean_step = float(np.mean([step_ms.get(r.rank, np.nan) for r in rows]))
    if run_step_ms and {r.rank for r in rows} >= set(step_ms):
        mean_step = run_step_ms
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
                f"Host synchronisation leaves the GPU idle {ms_text(cost)} ms per step "
                f"(the host blocks {ms_text(blocking)} ms in it)"
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
