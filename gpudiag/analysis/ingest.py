"""Read Kineto / torch.profiler Chrome traces into one normalised event table per rank.

Fast and bounded: each file is parsed with orjson in a worker process (ranks in
parallel), columns are built in one pass and the raw JSON is dropped at once; only the
args the analysis needs are kept. Bad files never raise: each gives one warning line
naming the file and the problem, and the other files are still analysed.

Times are integer epoch nanoseconds: ``baseTimeNanoseconds + ts * 1000`` (traces without
``baseTimeNanoseconds`` already carry absolute epoch microseconds).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpudiag.analysis.trace_files import (  # noqa: F401 - re-exported
    DEFAULT_MAX_TRACE_BYTES,
    MAX_BARE_RANK,
    _uncompressed_size_hint,
    max_trace_bytes,
    rank_from_name,
    read_trace_bytes,
)
from gpudiag.analysis.trace_model import (  # noqa: F401 - re-exported
    COMM_COLUMNS,
    EVENT_COLUMNS,
    STEP_COLUMNS,
    FrameColumns,
    FramePart,
    RankTrace,
    TraceError,
    TraceMeta,
    _first_line,
    drop_events,
    no_comm,
    share_empty_events,
    with_comm,
)
from gpudiag.analysis.trace_parse import parse_trace, read_trace, repair_unicode  # noqa: F401
from gpudiag.analysis.trace_table import _build_rank_trace
from gpudiag.rundir import (  # noqa: F401 - find_traces & co. re-exported
    BadInput,
    find_traces,
    is_trace_name,
    release_free_memory,
    trace_name_stem,
)

# Two traces whose time ranges are this far apart come from different runs.
SEPARATE_RUN_GAP_NS = 600 * 1_000_000_000


# --------------------------------------------------------------------------- one rank


def load_trace(
    path: str | os.PathLike[str], *, max_bytes: int | None = None
) -> tuple[RankTrace | None, list[str]]:
    """Parse one file. Returns (trace or None, warnings); never raises for bad content."""
    path = Path(path)
    warnings: list[str] = []
    collecting = gc.isenabled()
    gc.disable()  # millions of fresh containers, none cyclic: GC passes cost ~20 %
    try:
        doc, events = read_trace(path, max_bytes or max_trace_bytes(), warnings)
        trace = _build_rank_trace(doc, events, path, warnings)
    except TraceError as exc:
        warnings.append(BadInput(f"{path}: {exc}"))
        return None, warnings
    except MemoryError:
        warnings.append(BadInput(f"{path}: out of memory while parsing; skipped"))
        return None, warnings
    except Exception as exc:  # noqa: BLE001 - a defect of ours must cost one file, not the run
        warnings.append(
            BadInput(f"{path}: could not be analysed ({type(exc).__name__}: {_first_line(exc)})")
        )
        return None, warnings
    finally:
        if collecting:
            gc.enable()
    return trace, warnings


# --------------------------------------------------------------------------- many ranks


Prepare = Callable[[RankTrace], None]
# One load job: (path, size limit, prepare, keep the events).
LoadJob = tuple[str, int, "Prepare | None", bool]
LoadResult = tuple["RankTrace | None", list[str]]
Arrivals = Iterator[tuple[int, LoadResult]]  # (job index, its result), as each arrives
# Runs ``task`` on every job, possibly elsewhere (gpudiag.analysis.dask_tasks), and yields
# each result with its job's index as it arrives (in any order).
RunTasks = Callable[
    [Callable[[LoadJob], LoadResult], list[LoadJob]], Iterable[tuple[int, LoadResult]]
]


def _load_and_prepare(
    path: str | os.PathLike[str], limit: int, prepare: Prepare | None, keep_events: bool = True
) -> LoadResult:
    trace, warnings = load_trace(path, max_bytes=limit)
    if trace is not None and prepare is not None:
        try:
            prepare(trace)
        except Exception:  # noqa: BLE001 - the analysis recomputes it and reports the error
            trace.cache.clear()
    if trace is not None and not keep_events:
        drop_events(trace)
    return trace, warnings


def load_task(job: LoadJob) -> LoadResult:
    """The per-rank task: load one trace and run ``prepare`` on it. The local process
    pool and a Dask cluster (gpudiag.analysis.dask_tasks) both run exactly this."""
    return _load_and_prepare(*job)


def load_traces(
    paths: Iterable[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    warnings: list[str],
    max_bytes: int | None = None,
    prepare: Prepare | None = None,
    prepare_for: Callable[[Path], Prepare | None] | None = None,
    run_tasks: RunTasks | None = None,
    on_arrival: Callable[[RankTrace], None] | None = None,
) -> list[RankTrace]:
    """Load every file (in parallel processes when there are several files and cores),
    assign ranks, and drop duplicates / files from another run with a warning each.

    ``prepare(trace)``, a module-level function, runs on each trace where it was loaded
    (so in the worker) to fill ``trace.cache`` with per-rank results; it must not depend
    on the rank number, which is only final once every trace is loaded.

    ``prepare_for(path)``, when given, is each file's own ``prepare`` instead: a task
    carries only what its file needs (its node's clock offset, not every file's, which
    would make the tasks of a many-rank run grow with ranks x ranks).

    ``run_tasks``, when given, runs the per-rank tasks instead of the local pool (a Dask
    cluster); each trace then comes back without its events (:func:`drop_events`), so
    ``prepare`` must compute every per-rank result the analyses read.

    ``on_arrival(trace)`` runs on each loaded trace here as it arrives, before the next
    one is taken (fold.RankFold.add: keep only what the cross-rank analyses read)."""
    files = [p if isinstance(p, Path) else Path(p) for p in paths]  # the caller's, not copies
    limit = max_bytes or max_trace_bytes()
    prepares = [prepare_for(p) if prepare_for is not None else prepare for p in files]
    arrivals: Iterable[tuple[int, LoadResult]]
    if run_tasks is not None:
        jobs = [(str(p), limit, prep, False) for p, prep in zip(files, prepares, strict=True)]
        arrivals = run_tasks(load_task, jobs)
    else:
        arrivals = _run_loads(files, workers, limit, prepares)
    results: list[LoadResult] = [(None, []) for _ in files]
    for i, result in arrivals:
        if result[0] is not None and result[0].meta.path == files[i]:
            result[0].meta.path = files[i]  # the file's Path, not the task's copy of it
        if result[0] is not None and on_arrival is not None:
            try:
                on_arrival(result[0])
            except Exception:  # noqa: BLE001, S110 - unfolded, the analyses read it as it is
                pass
        results[i] = result
    traces: list[RankTrace] = []
    for trace, notes in results:
        warnings.extend(notes)
        if trace is not None:
            traces.append(trace)
    traces = _drop_other_runs(traces, warnings)
    traces = _assign_ranks(traces, warnings)
    _warn_missing_ranks(traces, warnings)
    return sorted(traces, key=lambda t: t.meta.rank)


# Memory per trace, in bytes per uncompressed trace byte (bench/memory.py measures them):
# a loading worker peaks at its imports and one parsed chunk (_WORKER_BASE_BYTES) plus
# about 1.1x the trace (columns, then the event table and its transients; 1.5 with
# margin); every loaded trace is then kept by the parent (event table ~0.45x; 0.6).
_WORKER_BYTES_PER_TRACE_BYTE = 1.5
_KEPT_BYTES_PER_TRACE_BYTE = 0.6
_WORKER_BASE_BYTES = 200 << 20


def plan_workers(sizes: Sequence[int], available: int) -> int:
    """How many traces of these (uncompressed) sizes to load at once within ``available``
    bytes: the parent keeps every loaded trace, and each worker holds the trace it loads
    (the largest ones are assumed to load together). At least 1."""
    budget = 0.8 * available - _KEPT_BYTES_PER_TRACE_BYTE * sum(sizes)
    n = 0
    for size in sorted(sizes, reverse=True):
        budget -= _WORKER_BASE_BYTES + _WORKER_BYTES_PER_TRACE_BYTE * size
        if budget < 0:
            break
        n += 1
    return max(1, n)


# Each loading process costs its imports (~110 MiB: pandas, pyarrow, numpy) besides the
# trace it loads: below this much input per worker, a worker costs more memory than the
# trace it takes off the parent (issue 16 item 10: peak <= 3x the input). Without
# --workers, one worker per this many (uncompressed) bytes at most.
_MIN_BYTES_PER_WORKER = 64 << 20


def workers_for_input(sizes: Sequence[int]) -> int:
    """At most one worker per ``_MIN_BYTES_PER_WORKER`` of input (at least 1): a small
    set of traces loads in the parent alone."""
    return max(1, sum(sizes) // _MIN_BYTES_PER_WORKER)


def _workers_for_memory(paths: Sequence[Path]) -> int:
    """As many parallel loads as the available memory holds (see plan_workers)."""
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - no psutil or no /proc: do not limit
        return len(paths) or 1
    return plan_workers([_uncompressed_size_hint(p) for p in paths], available)


def _run_loads(
    paths: Sequence[Path], workers: int | None, limit: int, prepares: Sequence[Prepare | None]
) -> Arrivals:
    """The local pool (or, with one worker, this process): each result with its file's
    index, as it arrives; ``prepares``: each file's."""
    cores = os.cpu_count() or 1
    if workers is None:
        workers = min(cores, workers_for_input([_uncompressed_size_hint(p) for p in paths]))
    n = min(len(paths), workers, _workers_for_memory(paths))
    done: set[int] = set()
    if n > 1:
        jobs: list[LoadJob] = [
            (str(p), limit, prep, True) for p, prep in zip(paths, prepares, strict=True)
        ]
        try:
            with ProcessPoolExecutor(max_workers=n) as pool:
                for i, result in enumerate(pool.map(load_task, jobs)):
                    done.add(i)
                    yield i, result
        except (OSError, RuntimeError):  # no process support (sandbox): the rest serially
            pass
    for i, p in enumerate(paths):
        if i not in done:
            yield i, _load_and_prepare(p, limit, prepares[i])


def _drop_other_runs(traces: list[RankTrace], warnings: list[str]) -> list[RankTrace]:
    """Keep the largest group of traces whose time ranges lie together."""
    if len(traces) < 2:
        return traces
    ordered = sorted(traces, key=lambda t: t.time_range[0])
    groups: list[list[RankTrace]] = [[ordered[0]]]
    group_end = ordered[0].time_range[1]
    for t in ordered[1:]:
        start, end = t.time_range
        if start - group_end > SEPARATE_RUN_GAP_NS:
            groups.append([t])
            group_end = end
        else:
            groups[-1].append(t)
            group_end = max(group_end, end)
    if len(groups) == 1:
        return traces
    keep = max(groups, key=len)
    lo, hi = min(t.time_range[0] for t in keep), max(t.time_range[1] for t in keep)
    for group in groups:
        if group is keep:
            continue
        for t in group:
            gap_s = abs(t.time_range[0] - lo) / 1e9
            warnings.append(
                f"{t.meta.path}: from a different run (its events are {gap_s:.0f} s away from "
                f"the other {len(keep)} trace(s), {_fmt_epoch(lo)}..{_fmt_epoch(hi)}); ignored"
            )
    return keep


def _fmt_epoch(ns: int) -> str:
    import datetime as _dt

    try:
        return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    except (OverflowError, OSError, ValueError):
        return str(ns)


def _assign_ranks(traces: list[RankTrace], warnings: list[str]) -> list[RankTrace]:
    taken: dict[int, RankTrace] = {}
    pending: list[RankTrace] = []
    for t in sorted(traces, key=lambda t: str(t.meta.path)):
        if t.meta.rank < 0:
            from_name = rank_from_name(t.meta.path, t.meta.world_size)
            if from_name is None:
                pending.append(t)
                continue
            t.meta.rank = from_name
            t.meta.rank_source = "file name"
        if t.meta.rank in taken:
            warnings.append(
                f"{t.meta.path}: a second trace for rank {t.meta.rank} (first: "
                f"{taken[t.meta.rank].meta.path.name}); ignored"
            )
            continue
        taken[t.meta.rank] = t
    for t in pending:
        rank = next(r for r in range(len(taken) + len(pending) + 1) if r not in taken)
        t.meta.rank = rank
        t.meta.rank_source = "order"
        taken[rank] = t
        warnings.append(
            f"{t.meta.path}: no rank in distributedInfo or file name; assumed rank {rank}"
        )
    for t in taken.values():
        t.set_step_rank()
    return list(taken.values())


def _warn_missing_ranks(traces: list[RankTrace], warnings: list[str]) -> None:
    sizes = {t.meta.world_size for t in traces if t.meta.world_size}
    if not sizes:
        return
    world = max(sizes)
    missing = sorted(set(range(world)) - {t.meta.rank for t in traces})
    if missing:
        where = traces[0].meta.path.parent if traces else ""
        warnings.append(
            f"{where}: traces for {len(missing)} of {world} ranks are missing "
            f"({'rank' if len(missing) == 1 else 'ranks'} {_ranges(missing)}); analysing the "
            f"{len(traces)} present"
        )


def _ranges(values: list[int]) -> str:
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)
