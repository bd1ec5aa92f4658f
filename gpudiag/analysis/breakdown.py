"""Where each step's time goes, per rank: compute, overlapped and exposed communication,
data loading, other host work, idle. Definitions: docs/analysis.md.

Every instant of a step falls in exactly one component, by priority:

1. ``comm_overlapped``: communication and compute both active
2. ``compute``: compute active, no communication
3. ``comm_exposed``: communication active, no compute
4. ``data_loading``: the training thread is in a DataLoader ``__next__``
5. ``other``: the training thread is busy with anything else (launches, Python, syncs)
6. ``idle``: none of the above

GPU traces: compute = GPU kernels, memcpy and memset on any stream; communication = comm
kernels. CPU (gloo) traces: compute = the training thread's operators running (profiler
category ``cpu_op``: ATen ops, autograd nodes), outside data loading and outside
collective calls; a user annotation, ``DistributedDataParallel.forward`` or an
``Optimizer.step`` range is not compute by itself, only the operators inside it.
Communication = gloo's transfers on its ``pt_gloo_runloop`` threads and the training
thread's time inside ``c10d::`` collective calls (blocked in ``c10d::allreduce_`` is
waiting, not computing). Python time with no operator running (a ``time.sleep`` in
forward) is ``other`` when the training thread is inside a recorded range, ``idle``
when it is in none.

The per-rank table (:func:`step_breakdown`) and the Timeline (:func:`timeline_lanes`)
both come from :func:`component_intervals`: the same instants, the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from gpudiag.analysis import classify as cls
from gpudiag.analysis import intervals as iv
from gpudiag.analysis.trace_model import FramePart, RankTrace

COMPONENTS = ("compute", "comm_overlapped", "comm_exposed", "data_loading", "idle", "other")
BREAKDOWN_COLUMNS = ("rank", "step", "step_ms", *COMPONENTS)

_GPU_COMPUTE_KINDS = ("compute", "memcpy", "memset")
_HOST_SKIP_KINDS = ("step",)
# CPU traces: the operators (profiler category cpu_op) that count as compute
_CPU_COMPUTE_KINDS = ("cpu_op", "sync")


def is_gpu_trace(events: pd.DataFrame) -> bool:
    gpu = events["is_gpu"].to_numpy()
    kind = cls.kinds(events)
    return bool((gpu & cls.kind_in(kind, ["compute", "comm", "memcpy", "memset"])).any())


def gpu_without_kernels(rank_trace: RankTrace) -> bool:
    """The trace lists GPUs (deviceProperties) or calls the CUDA runtime, yet holds no
    GPU event: profiled without CUDA activities (CUPTI off). It is analysed as a CPU run."""
    return rank_trace.cached("gpu_without_kernels", lambda: _gpu_without_kernels(rank_trace))


def _gpu_without_kernels(rank_trace: RankTrace) -> bool:
    ev = rank_trace.events
    if ev.empty or ev["is_gpu"].to_numpy().any():
        return False
    listed = bool(rank_trace.meta.device_properties)
    return listed or bool(np.isin(ev["cat"].to_numpy(), ["cuda_runtime", "cuda_driver"]).any())


def gpu_without_kernels_warning(traces: list[RankTrace]) -> str | None:
    """One line for the whole run (None when every trace is as it seems)."""
    blind = [t for t in traces if gpu_without_kernels(t)]
    if not blind:
        return None
    names = sorted(
        {str(d.get("name")) for t in blind for d in t.meta.device_properties if d.get("name")}
    )
    gpus = f" ({', '.join(names[:2])})" if names else ""
    ranks = ", ".join(str(t.meta.rank) for t in blind[:8]) + (" ..." if len(blind) > 8 else "")
    where = blind[0].meta.path if len(blind) == 1 else blind[0].meta.path.parent
    return (
        f"{where}: the trace{'s' if len(blind) > 1 else ''} of rank{'s' if len(blind) > 1 else ''}"
        f" {ranks} list{'' if len(blind) > 1 else 's'} GPUs{gpus} but hold"
        f"{'' if len(blind) > 1 else 's'} no GPU kernels (profiled without CUDA activities, "
        "CUPTI off?): analysed as a CPU run; GPU busy/idle, overlap and communication "
        "kernels are unknown (profile with ProfilerActivity.CUDA)"
    )


def _set(events: pd.DataFrame, mask: np.ndarray) -> iv.Intervals:
    return iv.union(events["start_ns"].to_numpy()[mask], events["end_ns"].to_numpy()[mask])


def activity_sets(rank_trace: RankTrace) -> iv.PackedSets:
    """The four raw activity sets: compute, comm, data_loading, host (training thread busy).
    Computed once per trace and cached on it packed (they travel back from a Dask worker:
    the client's all-reduce stall reads ``compute``)."""
    return rank_trace.cached("activity_sets", lambda: iv.PackedSets(_activity_sets(rank_trace)))


def _activity_sets(rank_trace: RankTrace) -> dict[str, iv.Intervals]:
    ev = rank_trace.events
    kind = cls.kinds(ev)
    gpu = ev["is_gpu"].to_numpy()
    main = ev["main_thread"].to_numpy()
    loading = _set(ev, main & (kind == "dataloader"))
    host = _set(ev, main & ~cls.kind_in(kind, _HOST_SKIP_KINDS))
    comm = _set(ev, comm_event_mask(ev))
    if is_gpu_trace(ev):
        compute = _set(ev, gpu & cls.kind_in(kind, _GPU_COMPUTE_KINDS))
    else:
        ops = _set(ev, main & cls.kind_in(kind, _CPU_COMPUTE_KINDS))
        collective_calls = _set(ev, main & (kind == "comm_cpu"))
        compute = iv.subtract(iv.subtract(ops, loading), collective_calls)
    return {"compute": compute, "comm": comm, "data_loading": loading, "host": host}


def comm_event_mask(ev: pd.DataFrame) -> np.ndarray:
    """The events that make up communication: GPU traces, the comm kernels and gloo's
    transfers; CPU traces, gloo's transfers and the training thread's collective calls
    (``c10d::*``). gloo moves CUDA tensors through the host, on its own threads: on an
    H200 its ``gloo:all_reduce`` ranges held 1.8 ms of a 6.7 ms step with no GPU event."""
    kind = cls.kinds(ev)
    gpu = ev["is_gpu"].to_numpy()
    if is_gpu_trace(ev):
        return kind == "comm"
    main = ev["main_thread"].to_numpy()
    return ~gpu & ((kind == "comm") | (main & (kind == "comm_cpu")))


# Each component's instants from the activity sets (columns: compute, comm, data, host);
# an instant counts once: compute and communication together are overlapped
# communication, data loading counts where neither is, other host work where none is.
_COMPONENT_RULES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "comm_overlapped": lambda a: a[:, 0] & a[:, 1],
    "compute": lambda a: a[:, 0] & ~a[:, 1],
    "comm_exposed": lambda a: a[:, 1] & ~a[:, 0],
    "data_loading": lambda a: a[:, 2] & ~a[:, 0] & ~a[:, 1],
    "other": lambda a: a[:, 3] & ~a[:, 2] & ~a[:, 0] & ~a[:, 1],
}


def component_intervals(
    rank_trace: RankTrace, components: Sequence[str] = tuple(_COMPONENT_RULES)
) -> dict[str, iv.Intervals]:
    """Disjoint interval sets, one per component except ``idle`` (the remainder); only
    ``components`` are worked out."""
    ordered = activity_sets(rank_trace).several(("compute", "comm", "data_loading", "host"))
    return {name: iv.combine(ordered, _COMPONENT_RULES[name]) for name in components}


LANE_OF = {
    "compute": "compute",
    "comm_overlapped": "communication",
    "comm_exposed": "communication",
    "data_loading": "data_loading",
    "other": "other",
}


def timeline_lanes(rank_trace: RankTrace) -> dict[str, iv.Intervals]:
    """The Timeline's lanes, from the same intervals as the per-rank table: ``compute``
    (compute and overlapped communication's compute), ``communication`` (overlapped and
    exposed), ``data_loading``, ``other`` (host busy, nothing else) and ``idle`` (the rest
    of each profiled step). Per step, compute + communication + data_loading + other +
    idle lanes cover what the table's six columns sum to."""
    parts = component_intervals(rank_trace)
    sets = activity_sets(rank_trace)
    lanes = {
        "compute": sets["compute"],
        "communication": sets["comm"],
        "data_loading": parts["data_loading"],
        "other": parts["other"],
    }
    windows = step_windows(rank_trace) if len(rank_trace.steps) else None
    if windows is not None and len(windows):
        steps = iv.union(windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy())
        covered = iv.merge(*(lanes[k] for k in lanes))
        lanes["idle"] = iv.subtract(steps, covered)
    else:
        lanes["idle"] = iv.empty()
    return lanes


def step_windows(rank_trace: RankTrace) -> pd.DataFrame:
    """(step, start_ns, end_ns) per profiled step; a trace without ProfilerStep marks is
    one window (step -1) spanning its events. Cached on the trace: the cross-rank wait for
    peers (comms.peer_wait) reads it where the events are no longer at hand."""
    return rank_trace.cached("step_windows", lambda: _step_windows(rank_trace)).copy()


def step_window_bounds(rank_trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_windows`' (start_ns, end_ns) as int64 arrays, read without a DataFrame
    where the trace holds them folded (the wait for peers reads them for every rank)."""
    held = rank_trace.cache.get("step_windows")
    if isinstance(held, FramePart):
        start, end = held.columns(("start_ns", "end_ns"))
        return start.astype(np.int64), end.astype(np.int64)
    windows = step_windows(rank_trace)
    return windows["start_ns"].to_numpy(dtype=np.int64), windows["end_ns"].to_numpy(dtype=np.int64)


def _step_windows(rank_trace: RankTrace) -> pd.DataFrame:
    steps = rank_trace.steps
    ev = rank_trace.events
    if len(steps):
        windows = steps[["step", "start_ns", "end_ns"]].reset_index(drop=True)
        return _device_windows(ev, windows)
    if ev.empty:
        return pd.DataFrame({"step": [], "start_ns": [], "end_ns": []}, dtype="int64")
    return pd.DataFrame(
        {"step": [-1], "start_ns": [_traced_start(ev)], "end_ns": [int(ev["end_ns"].max())]}
    )


def _gpu_work(ev: pd.DataFrame) -> np.ndarray:
    return ev["is_gpu"].to_numpy(dtype=bool) & cls.kind_in(
        cls.kinds(ev), ["compute", "comm", "memcpy", "memset"]
    )


def _traced_start(ev: pd.DataFrame) -> int:
    """Where a trace without ProfilerStep marks starts to count: at its first GPU event on
    a GPU trace (what runs before it is start-up: CUDA initialisation, a first
    ``aten::to`` of 29.9 s, reported apart as :func:`startup_ns`), else its first event."""
    gpu = _gpu_work(ev)
    if gpu.any():
        return int(ev["start_ns"].to_numpy()[gpu].min())
    return int(ev["start_ns"].min())


def startup_ns(rank_trace: RankTrace) -> int:
    """A trace without ProfilerStep marks: the time from its first event to its first GPU
    event (start-up: CUDA initialisation, the first copies), which the one window over
    the trace leaves out; 0 otherwise."""
    ev = rank_trace.events
    if len(rank_trace.steps) or ev.empty:
        return 0
    return _traced_start(ev) - int(ev["start_ns"].min())


def _device_windows(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """GPU traces: each step's window as torch-tb-profiler's ``StepParser`` sets it. A
    step ends when its CPU side ends or when the last GPU event it launched ends, which
    ever is later, and starts when its CPU side starts or the previous step ends,
    whichever is later; the first step starts after the GPU work launched before
    profiling began (the last GPU event not launched inside any step that ends before
    the first GPU event the first step launched): kernels queued before the profiler
    started are not the first step's work. CPU traces, or a GPU trace whose steps
    launched nothing: the CPU step boundaries."""
    gpu = _gpu_work(ev)
    if not gpu.any():
        return windows
    corr = ev["correlation"].to_numpy()
    step = ev["step"].to_numpy()
    cpu_in_step = ~ev["is_gpu"].to_numpy(dtype=bool) & (corr >= 0) & (step >= 0)
    # a GPU event's step is its launch's (ingest) when the launch is inside a step
    launched = gpu & (corr >= 0) & np.isin(corr, corr[cpu_in_step])
    if not launched.any():
        return windows
    starts = ev["start_ns"].to_numpy(dtype=np.int64)
    ends = ev["end_ns"].to_numpy(dtype=np.int64)
    of_step = pd.DataFrame({"step": step[launched], "s": starts[launched], "e": ends[launched]})
    device = of_step.groupby("step").agg(s=("s", "min"), e=("e", "max"))
    numbers = windows["step"].to_numpy()
    cpu_s = windows["start_ns"].to_numpy(dtype=np.int64)
    cpu_e = windows["end_ns"].to_numpy(dtype=np.int64)
    dev_s = device["s"].reindex(numbers).to_numpy(dtype=float)
    dev_e = device["e"].reindex(numbers).to_numpy(dtype=float)
    prev = int(cpu_s[0])
    if not np.isnan(dev_s[0]):
        before = gpu & ~launched & (ends < dev_s[0])
        if before.any():
            prev = max(prev, int(ends[before].max()))
    out_s = np.empty(len(windows), dtype=np.int64)
    out_e = np.empty(len(windows), dtype=np.int64)
    for i in range(len(windows)):
        start = max(prev, int(cpu_s[i]))
        end = int(cpu_e[i]) if np.isnan(dev_e[i]) else max(int(cpu_e[i]), int(dev_e[i]))
        out_s[i], out_e[i] = start, max(end, start)
        prev = out_e[i]
    return pd.DataFrame({"step": numbers, "start_ns": out_s, "end_ns": out_e})


def step_breakdown(rank_trace: RankTrace) -> pd.DataFrame:
    """Per step, milliseconds in each component; the components sum to ``step_ms``."""
    out = rank_trace.cached("step_breakdown", lambda: _step_breakdown(rank_trace)).copy()
    out["rank"] = rank_trace.meta.rank
    return out


def _step_breakdown(rank_trace: RankTrace) -> pd.DataFrame:
    windows = step_windows(rank_trace)
    if windows.empty:
        return pd.DataFrame(columns=list(BREAKDOWN_COLUMNS))
    lo = windows["start_ns"].to_numpy(dtype=np.int64)
    hi = windows["end_ns"].to_numpy(dtype=np.int64)
    out = pd.DataFrame({"rank": -1, "step": windows["step"].to_numpy()})  # rank: on return
    out["step_ms"] = (hi - lo) / 1e6
    parts = component_intervals(rank_trace)
    covered = np.zeros(len(windows), dtype=np.int64)
    for name in ("compute", "comm_overlapped", "comm_exposed", "data_loading", "other"):
        ns = iv.per_window_length(parts[name], lo, hi)
        covered += ns
        out[name] = ns / 1e6
    out["idle"] = np.maximum(hi - lo - covered, 0) / 1e6
    return out[list(BREAKDOWN_COLUMNS)]


def comm_comp_overlap(rank_trace: RankTrace) -> float:
    """Percent of communication time that overlaps computation: HTA 0.5.0's
    ``get_comm_comp_overlap`` (with ``include_last_profiler_step=True``) exactly.
    GPU traces: |comm kernels ∩ compute kernels| / |comm kernels|, compute = GPU kernels
    other than comm, memcpy and memset; with two or more ProfilerSteps only the kernels
    whose launch (the CPU event with the same correlation id) starts at or before the
    end of the last step count, so kernels with no launch event in the trace do not.
    CPU traces: the same ratio on the CPU sets. NaN when the trace has no communication."""
    return rank_trace.cached("comm_comp_overlap", lambda: _comm_comp_overlap(rank_trace))


def _comm_comp_overlap(rank_trace: RankTrace) -> float:
    ev = rank_trace.events
    if is_gpu_trace(ev):
        kind = cls.kinds(ev)
        gpu = ev["is_gpu"].to_numpy() & hta_launched(ev)
        compute = _set(ev, gpu & (kind == "compute"))
        comm = _set(ev, gpu & (kind == "comm"))
    else:
        sets = activity_sets(rank_trace)
        compute, comm = sets["compute"], sets["comm"]
    total = iv.length(comm)
    if total == 0:
        return float("nan")
    return 100.0 * iv.length(iv.intersect(comm, compute)) / total


def overlap_by_rank(traces: list[RankTrace], ranks: pd.Series) -> np.ndarray:
    """:func:`comm_comp_overlap` for each rank in ``ranks`` (NaN where none)."""
    by_rank = {t.meta.rank: comm_comp_overlap(t) for t in traces}
    return np.array([by_rank.get(int(r), np.nan) for r in ranks], dtype=float)


def hta_launched(events: pd.DataFrame) -> np.ndarray:
    """HTA's kernel filter (``Trace._filter_irrelevant_gpu_kernels`` with the last step
    included): with two or more ProfilerSteps in the trace, a GPU event counts when a CPU
    event with its correlation id starts at or before the end of the last step; with
    fewer steps every GPU event counts. CPU events are always True."""
    gpu = events["is_gpu"].to_numpy()
    kind = cls.kinds(events)
    cpu = ~gpu
    marks = cpu & (kind == "step")
    if events["name"].to_numpy()[marks].size == 0 or len(set(events["name"][marks])) < 2:
        return np.ones(len(events), dtype=bool)
    last_end = events["end_ns"].to_numpy()[marks].max()
    corr = events["correlation"].to_numpy()
    launched = cpu & (corr >= 0) & (events["start_ns"].to_numpy() <= last_end)
    return cpu | (np.isin(corr, corr[launched]) & (corr >= 0))


def run_breakdown(traces: list[RankTrace]) -> pd.DataFrame:
    from gpudiag.analysis.fold import rank_rows

    frames = rank_rows(traces, "step_breakdown", step_breakdown)
    if not frames:
        return pd.DataFrame(columns=list(BREAKDOWN_COLUMNS))
    return pd.concat(frames, ignore_index=True)
