"""``analyze(path)``: run every analysis on a run directory or on profiler traces and
gather them into an :class:`~gpudiag.analysis.result.AnalysisResult`.

One analysis failing becomes a one-line warning; the others still run.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudiag.analysis import (
    dataloader,
    dataparallel,
    ddp,
    failures,
    gpu,
    gradient_sync,
    host,
    manifest_facts,
    slow_rank,
    startup,
    steady,
    whatif,
)
from gpudiag.analysis import findings as fnd
from gpudiag.analysis import straggler_findings as stf
from gpudiag.analysis.dataloader import DataLoaderResult
from gpudiag.analysis.findings import Finding, attach_locations, sort_findings
from gpudiag.analysis.gpu import GpuResult
from gpudiag.analysis.result import (
    BREAKDOWN_COLUMNS,
    BREAKDOWN_KEYS,
    RANK_COLUMNS,
    AnalysisInputError,
    AnalysisResult,
    RunInfo,
)
from gpudiag.analysis.slow_rank import SlowRankCause
from gpudiag.analysis.spill import SpilledTable, SpillFile, lowest_rank_rows
from gpudiag.analysis.store import CallStore
from gpudiag.analysis.sync_points import sync_point_findings, sync_points

if TYPE_CHECKING:
    from gpudiag.analysis.ingest import RunTasks


def _guard(
    warnings: list[str], label: str, fn: Any, *args: Any, default: Any = None, **kw: Any
) -> Any:
    """Run one analysis; a failure becomes a one-line warning instead of killing the rest."""
    try:
        return fn(*args, **kw)
    except Exception as exc:  # noqa: BLE001 - one broken analysis must not hide the others
        _skipped(warnings, label, exc)
        return default


def _skipped(warnings: list[str], label: str, exc: Exception) -> None:
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    warnings.append(f"{label} skipped: {type(exc).__name__}: {first}")


SUMMARY_ONLY_RANKS = 256


def _many_ranks(path: Path) -> bool:
    from gpudiag import rundir

    return (
        rundir.is_dir(path)
        and rundir.is_run_dir(path)
        and len(rundir.list_ranks(path)) > SUMMARY_ONLY_RANKS
    )


def _optional(module: str) -> Any:
    """A core analysis module, or None while it is not part of this checkout."""
    import importlib

    try:
        return importlib.import_module(f"gpudiag.analysis.{module}")
    except ImportError:
        return None


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame(columns=list(columns))


def _resolve_inputs(
    path: Path, parts: list[Path] | None = None
) -> tuple[Any, list[Path], list[str]]:
    """(Run or None, trace files, warnings) for a run dir, a trace dir or a trace file;
    ``parts``: the per-node directories of one multi-node job (read as one run)."""
    from gpudiag import rundir

    if parts:
        return _load_run(parts)
    if not rundir.lexists(path):
        raise AnalysisInputError(f"{path}: no such file or directory")
    if not rundir.is_dir(path):  # a trace file, or what the reader refuses with a warning
        return None, [path], []
    problems: list[str] = []
    if rundir.list_dir(path, problems) is None:
        raise AnalysisInputError(problems[0])
    if rundir.is_run_dir(path) or rundir.node_parts(path):
        return _load_run(path)
    warnings: list[str] = []
    return None, rundir.find_traces(path, warnings), warnings


def _load_run(path: Path | list[Path]) -> tuple[Any, list[Path], list[str]]:
    from gpudiag import rundir

    try:
        run = rundir.load_run(path)
    except rundir.RunFormatError as exc:  # a directory that cannot be listed
        raise AnalysisInputError(str(exc)) from None
    files = [run.trace_files[r] for r in sorted(run.trace_files)]
    return run, files, list(run.warnings)


def _trace_offsets(run: Any) -> dict[str, int]:
    """trace path -> clock offset of its rank's node (multi-node runs)."""
    if run is None or not run.clock_offsets:
        return {}
    return {
        str(path): run.clock_offsets[r]
        for r, path in run.trace_files.items()
        if run.clock_offsets.get(r)
    }


def _breakdown_from_steps(run: Any) -> pd.DataFrame:
    """Without traces: step time from the steps table, data wait from data_ns, rest other."""
    steps = getattr(run, "steps", None)
    if steps is None or steps.empty:
        return _empty(BREAKDOWN_COLUMNS)
    s = steps.dropna(subset=["start_ns", "end_ns"])
    step_ms = (s["end_ns"].astype(float) - s["start_ns"].astype(float)) / 1e6
    data = (
        pd.to_numeric(s.get("data_ns"), errors="coerce").fillna(0) / 1e6 if "data_ns" in s else 0.0
    )
    data = np.minimum(data, step_ms)
    out = pd.DataFrame(
        {"rank": s["rank"].astype(int), "step": s["step"].astype(int), "step_ms": step_ms}
    )
    for key in BREAKDOWN_KEYS:
        out[key] = 0.0
    out["data_loading"] = data
    out["other"] = step_ms - data
    return out.reset_index(drop=True)


def rank_table(breakdown: pd.DataFrame) -> pd.DataFrame:
    if breakdown is None or breakdown.empty:
        return _empty(RANK_COLUMNS)
    g = breakdown.groupby("rank")
    out = pd.DataFrame(
        {
            "steps": g["step_ms"].count(),
            "step_ms_mean": g["step_ms"].mean(),
            "step_ms_median": g["step_ms"].median(),
            "step_ms_p90": g["step_ms"].quantile(0.9),
        }
    )
    for key in BREAKDOWN_KEYS:
        out[key] = g[key].mean() if key in breakdown else 0.0
    return out.reset_index()[list(RANK_COLUMNS)]


def _run_info(
    path: Path,
    run: Any,
    traces: list[Any],
    breakdown: pd.DataFrame,
    steady_ms: float | None = None,
    steady_basis: str | None = None,
) -> RunInfo:
    manifest = getattr(run, "manifest", None) or {}
    metas = [t.meta for t in traces]
    devices: list[str] = []
    for m in metas:
        for d in m.device_properties or []:
            name = d.get("name") if isinstance(d, dict) else None
            if name and name not in devices:
                devices.append(str(name))
    if run is not None:
        for info in run.rank_info.values():
            dev = info.get("device_name") or info.get("device")
            if dev and str(dev) not in devices:
                devices.append(str(dev))
    world = (run.world_size if run is not None else None) or max(
        (m.world_size or 0 for m in metas), default=0
    )
    backend = manifest.get("backend") or next((m.backend for m in metas if m.backend), None)
    if backend is None and run is not None:
        backend = next((i.get("backend") for i in run.rank_info.values() if i.get("backend")), None)
    ranks_seen = sorted({m.rank for m in metas} | set(run.ranks if run is not None else []))
    return RunInfo(
        kind="gpudiag_run" if run is not None else "traces",
        path=str(path),
        world_size=world or None,
        backend=backend,
        devices=devices,
        ranks_present=ranks_seen,
        traced_ranks=sorted(m.rank for m in metas),
        steps_analysed=int(breakdown["step"].nunique()) if len(breakdown) else 0,
        has_gpu_trace=any(_has_gpu_events(t) for t in traces),
        status=manifest.get("status"),
        exit_code=manifest.get("exit_code"),
        script=manifest_facts.script_and_arguments(manifest),
        total_steps=int(len(run.steps)) if run is not None and len(run.steps) else None,
        nodes=len(manifest_facts.hosts(manifest)) or None,
        cores_per_node=manifest_facts.cores_per_node(manifest),
        threads_per_rank=manifest_facts.threads_per_rank(manifest),
        steady_step_ms=steady_ms,
        steady_step_basis=steady_basis if steady_ms is not None else None,
        steady_steps=steady.steady_step_count(run.steps) if steady_ms is not None else None,
        warmup_steps=steady.warmup_step_count(run.steps) if steady_ms is not None else None,
        ddp_evidence=ddp.ddp_evidence(traces, run),
    )


def completed_steps(steps: pd.DataFrame) -> set[int]:
    """Steps every rank of the steps table finished (a failed or hung run's last,
    unfinished step is not one of them)."""
    if steps is None or steps.empty or "step" not in steps:
        return set()
    done = steps.dropna(subset=["end_ns"]) if "end_ns" in steps else steps
    if "rank" not in done:
        return {int(s) for s in done["step"].unique()}
    n_ranks = steps["rank"].nunique()
    per_step = done.groupby("step")["rank"].nunique()
    return {int(s) for s in per_step.index[per_step.to_numpy() >= n_ranks]}


@dataclass(frozen=True)
class _SteadyRule:
    """Which collectives count for straggler matching, by their step (_steady_state)."""

    done: frozenset[float] | None = None  # steps every rank completed (None: every row)
    after: float | None = None  # and only steps after this one (the warm-up step)

    def keeps(self, step: pd.Series) -> np.ndarray:
        if self.done is None:
            return np.ones(len(step), dtype=bool)
        step = pd.to_numeric(step, errors="coerce").fillna(-1)
        kept = step.isin(self.done)
        if self.after is not None:
            kept &= step > self.after
        return kept.to_numpy()

    def rows(self, calls: pd.DataFrame) -> pd.DataFrame:
        """The calls that count (all of them where the rule keeps every row)."""
        return calls if self.done is None else calls[self.keeps(calls["step"])]


def _steady_state(
    coll: SpilledTable, traces: list[Any], run: Any
) -> tuple[_SteadyRule | None, pd.DataFrame]:
    """The rule choosing the collectives for straggler matching (None: no call is left),
    and the steps they span. Only steps that every rank completed count (a failed or hung
    run is judged on the steps it finished, not on the time it hung). The run's first
    step (and collectives outside any step: DDP's construction broadcasts) is warm-up
    where ranks start at different times; it is left out when the run has 3 steps or
    more. The steps frame covers exactly the steps the collectives come from, so the
    per-step costs divide by the right count (the run's collectives span every step, the
    trace only the profiled window). Reads the calls' steps one piece at a time."""
    from gpudiag.analysis import fold

    if run is not None and len(run.steps):
        steps = run.steps
    else:
        per_rank = fold.rank_rows(traces, fold.STEPS, lambda t: t.steps.assign(rank=t.meta.rank))
        if not per_rank:
            return (_SteadyRule() if len(coll) else None), _empty(
                ("rank", "step", "start_ns", "end_ns")
            )
        steps = pd.concat(per_rank, ignore_index=True)
    if not len(coll):
        return None, steps
    seen = _distinct_steps(coll)
    if seen is None:  # no call has a step
        return _SteadyRule(), steps
    done = completed_steps(steps)
    present = np.sort([s for s in seen if s in done])
    rule = _SteadyRule(frozenset(float(s) for s in done))
    if len(present) >= 3:
        rule = _SteadyRule(rule.done, float(present[0]))
    elif not len(present):
        rule = _SteadyRule()
    used = pd.Series(sorted(seen), dtype=float)
    used = set(used[rule.keeps(used)])
    if not used:
        return None, steps
    return rule, steps[steps["step"].isin(used)]


def _distinct_steps(coll: SpilledTable) -> set[float] | None:
    """The calls' distinct steps (-1: none), None where no call has a step."""
    if "step" not in coll:
        return None
    seen: set[float] = set()
    any_step = False
    for piece in coll.pieces(["step"]):
        step = pd.to_numeric(piece["step"], errors="coerce")
        any_step = any_step or bool(piece["step"].notna().any())
        seen.update(step.fillna(-1).unique().tolist())
    return seen if any_step else None


def _arrivals(coll: SpilledTable, run: Any, comms: Any, warnings: list[str]) -> SpilledTable:
    """Collectives to match across ranks for stragglers: the run's own table when it has
    one (every step, matched on sequence numbers, arrival = enqueue time) even where the
    collective table above comes from the traces for want of completion times."""
    if run is None or not len(run.collectives) or comms is None:
        return coll
    if len(coll) and all(
        p["source"].astype(str).str.startswith("run:").all() for p in coll.pieces(["source"])
    ):
        return coll
    from_run = _guard(warnings, "run collectives", comms.collective_table, [], run=run)
    return SpilledTable(from_run) if from_run is not None and len(from_run) else coll


@dataclass(frozen=True)
class _Skew:
    table: SpilledTable  # stragglers.arrival_skew's rows
    steps: pd.DataFrame  # the steps its collectives come from


def _arrival_skew(
    coll: SpilledTable,
    traces: list[Any],
    run: Any,
    comms: Any,
    strag: Any,
    warnings: list[str],
    spill: SpillFile,
) -> _Skew | None:
    """The arrival skew of the steady-state steps' collectives, kept in the spill file,
    and the steps it spans; None where it could not be measured."""
    if strag is None:
        return None
    arrivals = _arrivals(coll, run, comms, warnings)
    rule, steps = _steady_state(arrivals, traces, run)
    if rule is None:
        return None
    skew = _guard(warnings, "arrival skew", _kept_skew, arrivals, rule, strag, spill)
    return _Skew(skew, steps) if skew is not None else None


def _kept_skew(
    arrivals: SpilledTable, rule: _SteadyRule, strag: Any, spill: SpillFile
) -> SpilledTable:
    """stragglers.arrival_skew of the calls the rule keeps, matched through the spill
    file and each piece spilled as it is made."""
    kept = SpilledTable.build(strag.arrival_skew_pieces(arrivals, spill, rule.rows), spill)
    return kept if kept is not None else SpilledTable(strag.no_skew())


def _peer_wait(
    traces: list[Any],
    coll: SpilledTable,
    run: Any,
    comms: Any,
    warnings: list[str],
    spill: SpillFile,
) -> pd.DataFrame | None:
    """Each traced rank's exposed wait for late peers (comms.peer_wait); None when it
    could not be measured (exposed_communication then says less)."""
    if comms is None or not traces:
        return None
    world = (run.world_size if run is not None else None) or max(
        (t.meta.world_size or 0 for t in traces), default=0
    )
    return _guard(warnings, "wait for peers", comms.peer_wait, traces, coll, world or None, spill)


def _kept_buckets(coll: SpilledTable, comms: Any, spill: SpillFile) -> SpilledTable:
    """comms.ddp_buckets of each piece of the collective table (whole ranks: a rank's
    buckets are its own), each spilled as it is made."""
    pieces = (comms.ddp_buckets(piece) for piece in coll.pieces(comms.BUCKET_READS))
    kept = SpilledTable.build((p for p in pieces if len(p)), spill)
    return kept if kept is not None else SpilledTable(comms.ddp_buckets(None))


def _largest_bytes(coll: SpilledTable) -> float | None:
    """findings.largest_collective_bytes of the table, one piece at a time."""
    sizes = [fnd.largest_collective_bytes(piece) for piece in coll.pieces(["bytes"])]
    known = [size for size in sizes if size is not None]
    return max(known) if known else None


def _uses_ddp(traces: list[Any], run: Any) -> bool:
    return ddp.ddp_evidence(traces, run) is not None


def _backend_of(traces: list[Any], run: Any) -> str:
    manifest = run.manifest if run is not None else {}
    backend = manifest.get("backend") or next(
        (t.meta.backend for t in traces if t.meta.backend), ""
    )
    return str(backend).lower()


def _has_gpu_events(trace: Any) -> bool:
    return bool(trace.cached("has_gpu_events", lambda: bool(trace.events["is_gpu"].any())))


@dataclass(frozen=True)
class _StepBase:
    """The step times findings are rated against: the steady step (every recorded step
    after warm-up; else the profiled mean), the profiled window's mean step, and the
    per-rank steady figures (steady.py)."""

    step_ms: float
    window_ms: float | None
    rank_times: dict[int, steady.RankTime]
    run_steps: pd.DataFrame | None


@dataclass(frozen=True)
class _CommInputs:
    """What the straggler and communication findings read."""

    ranks: pd.DataFrame
    slow: pd.DataFrame | None
    stall: pd.DataFrame | None
    coll: SpilledTable
    buckets: SpilledTable | None
    comms: Any
    traces: list[Any]
    spill: SpillFile


def _communication_findings(
    base: _StepBase, inputs: _CommInputs, run: Any, warnings: list[str]
) -> list[Finding]:
    """straggler, then exposed_communication and bucket_size net of the wait for it."""
    contention = _guard(warnings, "host CPU", host.host_contention, run) if run else None
    ended_early = run is not None and (run.manifest or {}).get("status") in ("failed", "hang")
    steady_count = steady.steady_step_count(base.run_steps) or None
    straggler = stf.straggler_findings(
        inputs.slow,
        base.step_ms,
        contention,
        run.rank_nodes if run is not None else {},
        ended_early,
        causes=_slow_rank_causes(inputs.slow, base.rank_times, inputs.traces, steady_count),
        run_steps=steady_count,
        runq_ms=steady.median_runq_ms(base.rank_times),
    )
    runq_share = steady.runq_share(base.rank_times)
    ranks = inputs.ranks
    waited = sum(fnd.waiting_share(ranks, f.ranks, f.cost_ms_per_step) for f in straggler)
    owed = fnd.straggler_waits(ranks, straggler)
    largest = _largest_bytes(inputs.coll)
    comms = inputs.comms
    peer_wait = (
        _peer_wait(inputs.traces, inputs.coll, run, comms, warnings, inputs.spill)
        if comms is not None
        else None
    )
    late = [r for f in straggler for r in f.ranks]
    sync = _guard(warnings, "sync points", sync_points, inputs.traces, inputs.coll, run, late)
    latency = sync.per_rank_latency_ms if sync is not None else None
    found = straggler + fnd.exposed_comm_findings(
        ranks,
        base.step_ms,
        inputs.stall,
        straggler_ms=waited,
        straggler_wait=owed,
        largest_bytes=largest,
        peer_wait=peer_wait,
        runq_share=runq_share,
        window_step_ms=base.window_ms,
        ddp=_uses_ddp(inputs.traces, run),
        gloo_on_gpu=_backend_of(inputs.traces, run) == "gloo"
        and any(_has_gpu_events(t) for t in inputs.traces),
        sync_rounds=_guard(
            warnings,
            "gradient sync rounds",
            gradient_sync.gradient_sync_rounds,
            run.collectives if run is not None else None,
            run.ddp_stats if run is not None else None,
        ),
        sync_latency=latency,
        sync_exposed_ms=sync.exposed_ms if sync is not None else 0.0,
    )
    scale = fnd.window_scale(base.step_ms, base.window_ms)
    found += sync_point_findings(sync, base.step_ms, scale, runq_share)
    window = fnd.exposed_split(ranks, peer_wait, {r: w / scale for r, w in owed.items()}, latency)
    _note_comm_wait(ranks, window, peer_wait)
    if _uses_ddp(inputs.traces, run):
        found += fnd.bucket_findings(
            lowest_rank_rows(inputs.buckets),
            ranks,
            base.step_ms,
            split=window.scaled(scale),
            largest_bytes=largest,
            runq_share=runq_share,
            unsplittable=gradient_sync.unsplittable_share(run.ddp_stats if run else None),
        )
    return found


def _note_comm_wait(ranks: pd.DataFrame, window: fnd.ExposedSplit, peer_wait: Any) -> None:
    """The per-rank table's ``comm_wait``: the part of each rank's exposed communication
    spent waiting for late peers (a named straggler's wait included), in the profiled
    window as the table is; the rest of ``comm_exposed`` is the transfer. Every view
    splits the exposed communication by it, whatever finding the run has (the chart split
    it only when an exposed_communication finding existed: browser probe). Left out
    where a rank's wait could not be measured (no trace of a peer, unmatched calls)."""
    if peer_wait is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return
    known = fnd.measured_wait_ranks(ranks, peer_wait)
    if not all(known) or len(window.per_rank_waiting_ms) != len(ranks):
        return
    ranks.insert(
        list(ranks.columns).index("comm_exposed") + 1, "comm_wait", list(window.per_rank_waiting_ms)
    )


# Up to this many collective calls, the wall time per step is computed; a many-rank
# run goes without it.
WALL_MAX_CALLS = 2_000_000


def _collective_wall(coll: SpilledTable, comms: Any, warnings: list[str]) -> pd.DataFrame:
    """comms.collective_wall_per_step of the run's calls (empty above WALL_MAX_CALLS),
    read a piece (whole ranks) at a time: the calls as one frame held 0.47 GiB at
    16,384 Megatron-shaped ranks (docs/cluster.md)."""
    if comms is None or not len(coll) or len(coll) > WALL_MAX_CALLS:
        return pd.DataFrame()
    reads = ("rank", "op", "pg_name", "step", "start_ns", "end_ns", "dur_ms", "bytes", "source")
    columns = [c for c in reads if c in coll.columns]
    result = _guard(
        warnings,
        "collective wall time",
        lambda: comms.collective_wall_of_pieces(lambda: coll.pieces(columns)),
    )
    return result if result is not None else pd.DataFrame()


# A run file may claim any world size: at most this many missing ranks are listed (the
# rest are counted), so a corrupt size never becomes an allocation.
MAX_LISTED_UNRECORDED = 1024


def _unrecorded_ranks(world_size: int, present: list[int]) -> list[int]:
    """The ranks of the world that left nothing here, the first MAX_LISTED_UNRECORDED."""
    seen = set(present)
    out: list[int] = []
    for rank in range(world_size):
        if rank not in seen:
            out.append(rank)
            if len(out) >= MAX_LISTED_UNRECORDED:
                break
    return out


def _slow_rank_causes(
    slow: pd.DataFrame | None,
    times: dict[int, steady.RankTime],
    traces: list[Any],
    run_steps: int | None,
) -> dict[int, SlowRankCause]:
    """Where each flagged straggler's extra time per step goes (slow_rank.explain)."""
    if slow is None or not len(slow) or "is_straggler" not in slow or not times:
        return {}
    column = "median_cost_ms" if "median_cost_ms" in slow else "cost_ms_per_step"
    flagged = slow[slow["is_straggler"].astype(bool)]
    spread = stf.spread_over_run(slow, run_steps)
    causes = {}
    for rank, lead in zip(flagged["rank"], flagged[column], strict=False):
        cause = slow_rank.explain(int(rank), float(lead) * spread, times, traces)
        if cause is not None:
            causes[int(rank)] = cause
    return causes


def _recorded_steps(run: Any) -> int:
    """The most steps any rank recorded in the run's steps table (0 without one)."""
    steps = getattr(run, "steps", None)
    if steps is None or not len(steps) or not {"rank", "step"} <= set(steps.columns):
        return 0
    return int(steps.groupby("rank")["step"].nunique().max())


def _mean_step_ms(ranks: pd.DataFrame, run: Any) -> float:
    if len(ranks):
        return float(ranks["step_ms_mean"].astype(float).mean())
    return float("nan")


def shift_trace(trace: Any, offset_ns: int) -> None:
    """Put a trace on node 0's clock (its node's offset, rundir.Run.clock_offsets):
    once, before any analysis caches a time."""
    if not offset_ns or trace.cache.get("clock_offset_ns") is not None:
        return
    trace.events = _shifted(trace.events, offset_ns)
    trace.steps = _shifted(trace.steps, offset_ns)  # a folded step table: a copy, put back
    trace.meta.base_time_ns += offset_ns
    trace.cache["clock_offset_ns"] = offset_ns


def _prepare_for(offsets: dict[str, int]) -> Callable[[Path], Callable[[Any], None]]:
    """Each trace file's per-rank task: prepare_rank, with its node's clock offset alone
    where it has one (every file's offsets in every task would grow with ranks x ranks)."""
    absolute = {str(Path(p).absolute()): ns for p, ns in offsets.items()}

    def prepare(path: Path) -> Callable[[Any], None]:
        offset = absolute.get(str(Path(path).absolute()))
        if not offset:
            return prepare_rank
        return functools.partial(prepare_rank, clock_offset_ns=offset)

    return prepare


def _shifted(frame: pd.DataFrame, offset_ns: int) -> pd.DataFrame:
    for col in ("start_ns", "end_ns"):
        if col in frame and len(frame):
            frame[col] = frame[col] + offset_ns
    return frame


def _per_rank_analyses() -> list[Any]:
    """Every analysis that reads one rank's events. Each caches its result on the trace
    (``RankTrace.cached``, a failure included), so the cross-rank analyses in
    :func:`analyze` never need the events again."""
    from gpudiag.analysis import breakdown as bd
    from gpudiag.analysis import comms
    from gpudiag.analysis import timeline as tl

    return [
        bd.step_breakdown,
        bd.step_windows,  # comms.peer_wait's analysed steps
        bd.comm_comp_overlap,
        bd.gpu_without_kernels,
        bd.activity_sets,  # allreduce_stall's compute intervals
        comms.trace_rows,
        dataloader.trace_dataloader,
        dataloader.trace_host_sync,
        dataparallel.trace_dataparallel,
        gpu.kernel_busy,
        gpu.gemm_precision,
        ddp.trace_ddp_names,
        _has_gpu_events,
        tl.rank_timeline,
    ]


def prepare_rank(trace: Any, clock_offset_ns: int = 0) -> None:
    """The per-rank analyses: the per-rank task (ingest.load_task) runs them where it
    loaded the trace (a local pool process or a Dask worker), so they run in parallel;
    their results are cached on the trace for the cross-rank analyses below. One
    failing is kept in the cache and reported by the analysis that reads it.
    ``clock_offset_ns``: the trace's node's clock offset, applied first."""
    shift_trace(trace, clock_offset_ns)
    from gpudiag.analysis.ingest import release_free_memory

    for analysis in _per_rank_analyses():
        try:
            analysis(trace)
        except Exception:  # noqa: BLE001, S112 - cached; _guard reports it on the client
            continue
        finally:  # the analysis' freed work arrays: not the base of the next one's peak
            release_free_memory()


def analyze(
    path: str | Path | list[Path],
    *,
    workers: int | None = None,
    run_tasks: RunTasks | None = None,
) -> AnalysisResult:
    """Analyse a gpudiag run directory or any directory / file of profiler traces; a
    list: the per-node directories of one multi-node job (rundir.group_node_dirs).

    ``run_tasks`` (gpudiag.analysis.dask_tasks.DaskTasks, from ``cluster.connect``) runs
    ingest and the per-rank analyses on a Dask cluster instead of the local process
    pool; only per-rank results come back, the cross-rank analyses run here.

    The analysis is :data:`STEPS` in order, each reading what the earlier ones put in
    one :class:`_Work`; this function only loads the inputs and orders the steps."""
    from gpudiag.analysis import fold

    node_dirs = [Path(p) for p in path] if isinstance(path, list) and len(path) > 1 else None
    if isinstance(path, list):
        path = Path(os.path.commonpath(node_dirs)) if node_dirs else Path(path[0])
    path = Path(path)
    if node_dirs is None and _many_ranks(path):
        from gpudiag.analysis.summaries import analyze_summaries

        result = analyze_summaries(path)
        result.warnings.append(
            f"{path}: more than {SUMMARY_ONLY_RANKS} ranks; analysed from summary.json files only"
        )
        return result
    run, files, warnings = _resolve_inputs(path, node_dirs)
    folded = fold.RankFold()
    traces = _load_traces(files, run, folded, warnings, workers, run_tasks)
    if not traces and (
        run is None
        or (run.steps.empty and run.collectives.empty and not run.statuses and not run.manifest)
    ):
        detail = (
            "no readable profiler trace" if files else "no profiler traces or gpudiag run files"
        )
        raise AnalysisInputError(f"{path}: nothing to analyse ({detail})", warnings)
    work = _Work(path, run, traces, warnings, folded, _optional("comms"), _optional("stragglers"))
    with work.store:
        for _name, step in STEPS:
            step(work)
        return _result(work)


def _load_traces(
    files: list[Path],
    run: Any,
    folded: Any,
    warnings: list[str],
    workers: int | None,
    run_tasks: RunTasks | None,
) -> list[Any]:
    """The profiler traces, each shifted onto the run's clock (ingest's workers do it
    where they can)."""
    from gpudiag.analysis import ingest

    if not files:
        return []
    offsets = _trace_offsets(run)
    traces = ingest.load_traces(
        files,
        workers=workers,
        warnings=warnings,
        prepare_for=_prepare_for(offsets),
        run_tasks=run_tasks,
        on_arrival=folded.add,
    )
    for t in traces:  # where no worker prepared it
        shift_trace(t, offsets.get(str(t.meta.path), 0))
    return traces


@dataclass
class _Work:
    """What the steps of one analysis share: the inputs, then each step's output."""

    path: Path
    run: Any  # rundir.Run | None
    traces: list[Any]
    warnings: list[str]
    folded: Any  # fold.RankFold: the spill file of the per-call tables
    comms: Any  # the comms module (None in a build without it)
    strag: Any  # the stragglers module (idem)
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    steady_ms: float | None = None
    steady_from_gpu: bool = False
    window_ms: float | None = None
    step_ms: float = float("nan")
    rank_times: dict[int, steady.RankTime] = field(default_factory=dict)
    coll: SpilledTable = field(default_factory=SpilledTable.of)
    store: CallStore = field(default_factory=CallStore)  # the calls again, for SQL questions
    summary: pd.DataFrame | None = None
    buckets: SpilledTable | None = None
    stall: pd.DataFrame | None = None
    skew: _Skew | None = None
    slow: pd.DataFrame | None = None
    dp: Any = None  # dataparallel.DataParallelResult | None
    dl: DataLoaderResult = field(default_factory=DataLoaderResult)
    gpu_info: GpuResult = field(default_factory=GpuResult)
    info: RunInfo | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def run_steps(self) -> pd.DataFrame | None:
        return self.run.steps if self.run is not None else None


def _step_breakdown(w: _Work) -> None:
    """Per-step time split of each rank (traces; else the steps table) and its mean."""
    from gpudiag.analysis import breakdown as bd
    from gpudiag.analysis import fold

    blind = bd.gpu_without_kernels_warning(w.traces)
    if blind:
        w.warnings.append(blind)
    if w.traces:
        parts = fold.rank_rows(
            w.traces,
            "step_breakdown",
            bd.step_breakdown,
            on_error=lambda t, exc: _skipped(w.warnings, f"breakdown of rank {t.meta.rank}", exc),
        )
        w.breakdown = pd.concat(parts, ignore_index=True) if parts else _empty(BREAKDOWN_COLUMNS)
    else:
        w.breakdown = _breakdown_from_steps(w.run)
    w.ranks = rank_table(w.breakdown)
    if w.traces and len(w.ranks):
        w.ranks["comm_comp_overlap_pct"] = _guard(
            w.warnings, "comm/comp overlap", bd.overlap_by_rank, w.traces, w.ranks["rank"]
        )


def _step_times(w: _Work) -> None:
    """The step the findings are rated against: the steady step of every recorded step
    (the profiled window is slowed by the profiler); foreign traces have only their
    window."""
    gpu_ranks = {t.meta.rank for t in w.traces if _has_gpu_events(t)}
    # said by the step's label in every view (run.steady_step_basis), not as a problem
    # reading the run (the Overview listed it as one: probe 32)
    w.steady_ms, w.steady_from_gpu = steady.gpu_bounded_step_ms(
        steady.steady_step_ms(w.run_steps), w.breakdown, gpu_ranks
    )
    w.rank_times = steady.rank_times(w.run_steps)
    w.window_ms = _mean_step_ms(w.ranks, w.run) if w.traces else None
    w.step_ms = w.steady_ms if w.steady_ms is not None else _mean_step_ms(w.ranks, w.run)


def _step_collectives(w: _Work) -> None:
    """Every collective call of every rank, spilled to the fold's file and put in the call
    store as it is made, a few ranks at a time (a many-rank run's per-call tables are never
    all in memory, docs/cluster.md); its summary, DDP's buckets and the all-reduce stall."""
    comms = w.comms
    if comms is None or w.strag is None:
        w.warnings.append("communication and straggler analysis unavailable in this build")
    if comms is None:
        w.coll = SpilledTable(_empty(("rank", "pg_name", "seq", "op")))
        w.folded.spill_rows("collective_rows")
        return
    pieces = w.store.keeping(comms.collective_pieces(w.traces, run=w.run))
    table = _guard(
        w.warnings, "collective table", lambda: SpilledTable.build(pieces, w.folded.spill)
    )
    if table is None:  # none of its calls: the store's too
        w.store.clear()
    w.coll = table if table is not None else SpilledTable(_empty(("rank", "pg_name", "seq", "op")))
    w.folded.spill_rows("collective_rows")  # read into the table: kept on disk from now on
    if len(w.coll):
        w.summary = _guard(w.warnings, "collective summary", comms.collective_summary, w.store)
    w.buckets = _guard(w.warnings, "DDP buckets", _kept_buckets, w.coll, comms, w.folded.spill)
    if w.traces and len(w.coll):
        w.stall = _guard(
            w.warnings,
            "all-reduce stall",
            comms.allreduce_stall_by_ranks,
            w.traces,
            w.coll.pieces(comms.STALL_READS),
        )


def _step_stragglers(w: _Work) -> None:
    """Arrival skew of the steady steps' collectives, and the ranks it names slow."""
    w.skew = _arrival_skew(w.coll, w.traces, w.run, w.comms, w.strag, w.warnings, w.folded.spill)
    if w.skew is None or not len(w.skew.table):
        return
    w.slow = _guard(
        w.warnings, "stragglers", w.strag.stragglers, w.skew.table, w.skew.steps, w.folded.spill
    )
    rank_nodes = w.run.rank_nodes if w.run is not None else {}
    if w.slow is not None and len(w.slow) and rank_nodes:
        w.slow.insert(1, "node", [rank_nodes.get(int(r)) for r in w.slow["rank"]])


def _step_questions(w: _Work) -> None:
    """DataParallel, data loading and GPU health."""
    w.dp = _guard(
        w.warnings, "DataParallel", dataparallel.analyze_dataparallel, w.traces, w.step_ms
    )
    w.dl = _guard(
        w.warnings,
        "data loading",
        dataloader.analyze_dataloader,
        w.traces,
        w.run,
        default=DataLoaderResult(),
    )
    w.gpu_info = _guard(
        w.warnings,
        "GPU health",
        gpu.analyze_gpu,
        w.traces,
        _run_frame(w.run, "gpu_samples"),
        _run_frame(w.run, "steps"),
        default=GpuResult(),
    )


def _step_findings(w: _Work) -> None:
    """Every question's findings, linked, hedged, located and in their one order."""
    run = w.run
    step_by_rank = {r: t.step_ms for r, t in w.rank_times.items()} or dict(
        zip(w.ranks["rank"].astype(int), w.ranks["step_ms_mean"].astype(float), strict=False)
    )
    found: list[Finding] = []
    seen_warnings = len(run.warnings) if run is not None else 0
    found += failures.failure_findings(run)
    if run is not None:  # files the failure analysis could not read (last_call.json)
        w.warnings += [x for x in run.warnings[seen_warnings:] if x not in w.warnings]
    found += _communication_findings(
        _StepBase(w.step_ms, w.window_ms, w.rank_times, w.run_steps),
        _CommInputs(w.ranks, w.slow, w.stall, w.coll, w.buckets, w.comms, w.traces, w.folded.spill),
        run,
        w.warnings,
    )
    runq = steady.runq_per_step(w.rank_times)
    basis = "steady_median" if w.rank_times else "profiled_mean"
    found += dataloader.dataloader_findings(
        w.dl, step_by_rank, *runq, run_step_ms=w.step_ms, step_basis=basis
    )
    found += dataloader.startup_findings(w.dl, step_by_rank)
    found += startup.run_startup_findings(run, step_by_rank)
    found += dataloader.host_sync_findings(w.dl, step_by_rank, run_step_ms=w.step_ms)
    found += dataparallel.dataparallel_findings(w.dp, w.step_ms)
    found += gpu.gpu_findings(
        w.gpu_info, w.step_ms, dp_active=w.dp is not None and not w.dp.on_cpu, ranks=w.ranks
    )
    found += gpu.no_amp_findings(w.traces, w.step_ms)
    stf.link_straggler_causes(found)
    basis = "gpu" if w.steady_from_gpu else "host"
    w.info = info = _run_info(w.path, run, w.traces, w.breakdown, w.steady_ms, basis)
    if info.world_size and info.kind == "gpudiag_run":
        present = {r for r in info.ranks_present if 0 <= r < info.world_size}
        fnd.note_untraced_ranks(
            found,
            _unrecorded_ranks(info.world_size, info.ranks_present),
            info.world_size,
            info.world_size - len(present),
        )
    if info.kind == "gpudiag_run":  # a foreign trace's one step may be its whole span
        fnd.hedge_few_steps(found, max(info.steps_analysed, _recorded_steps(run)))
        dataloader.fit_loader_advice(found, info.cores_per_node, info.world_size, info.nodes or 1)
    attach_locations(found, getattr(run, "lint", None))
    w.findings = sort_findings(found)


# The analysis, in order: each step reads what the steps before it set in _Work.
STEPS: tuple[tuple[str, Callable[[_Work], None]], ...] = (
    ("breakdown", _step_breakdown),
    ("step times", _step_times),
    ("collectives", _step_collectives),
    ("stragglers", _step_stragglers),
    ("data parallel, data loading, GPU", _step_questions),
    ("findings", _step_findings),
)


def _run_frame(run: Any, name: str) -> pd.DataFrame:
    return getattr(run, name) if run is not None else _empty(())


def _result(w: _Work) -> AnalysisResult:
    assert w.info is not None  # set by the findings step
    return AnalysisResult(
        source=w.path,
        run=w.info,
        ranks=w.ranks,
        breakdown=w.breakdown,
        collectives=w.coll,
        collective_summary=w.summary if w.summary is not None else _empty(()),
        buckets=w.buckets if w.buckets is not None else SpilledTable(_empty(())),
        skew=w.skew.table if w.skew is not None else SpilledTable.of(),
        stragglers=w.slow if w.slow is not None else _empty(()),
        dataparallel=w.dp,
        dataloader=w.dl,
        gpu=w.gpu_info,
        gpu_samples=_run_frame(w.run, "gpu_samples"),
        host_samples=_run_frame(w.run, "host_samples"),
        findings=w.findings,
        lint=getattr(w.run, "lint", None),
        warnings=w.warnings,
        step_ms=w.step_ms,
        traces=w.traces,
        allreduce_stall=w.stall if w.stall is not None else pd.DataFrame(),
        run_steps=w.run.steps if w.run is not None else pd.DataFrame(),
        collective_wall=_collective_wall(w.coll, w.comms, w.warnings),
        whatif=whatif.project(
            w.findings,
            w.ranks,
            w.breakdown,
            w.store if _uses_ddp(w.traces, w.run) else None,
            steady_ms=w.steady_ms,
        ),
    )
