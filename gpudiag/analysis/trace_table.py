"""One rank's tables from the parsed columns: the event table (sorted by start,
times in epoch ns, kinds, threads, the training thread, each event's step) and the
collectives' side table (op, bytes, dtype, group, group size, seq; what a kernel's
args lack taken from its name or the CPU op that launched it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import classify as cls
from gpudiag.analysis.trace_model import (
    _COMM_FIELDS,
    _DTYPE_GUESS,
    STEP_COLUMNS,
    RankTrace,
    TraceError,
    TraceMeta,
    _comm_table,
    _empty_fields,
)
from gpudiag.analysis.trace_parse import (
    _NO_ARGS,
    _Collector,
    _comm_row,
    _int_or_none,
    _narrow,
    _num,
)
from gpudiag.rundir import MAX_WORLD_SIZE, BadInput, release_free_memory

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _build_rank_trace(
    doc: dict[str, Any], collected: _Collector, path: Path, warnings: list[str]
) -> RankTrace:
    dist = doc.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else None
    base = _int_or_none(doc.get("baseTimeNanoseconds")) or 0
    if not 0 <= base < 4 * 10**18:
        warnings.append(BadInput(f"{path}: implausible baseTimeNanoseconds {base}; using 0"))
        base = 0
    cols = collected.columns(warnings, path)
    release_free_memory()  # the per-chunk arrays just concatenated (~44 B per event)
    del collected
    devices = doc.get("deviceProperties")
    world = _int_or_none(dist.get("world_size")) if dist else None
    if world is not None and not 1 <= world <= MAX_WORLD_SIZE:
        # it sizes the "traces missing" list: a damaged one is unknown, never allocated
        warnings.append(
            BadInput(f"{path}: implausible distributedInfo world_size {world}; ignored")
        )
        world = None
    meta = TraceMeta(
        rank=-1,
        world_size=world,
        backend=str(dist["backend"]) if dist and dist.get("backend") else None,
        path=path,
        base_time_ns=base,
        device_properties=[d for d in devices if isinstance(d, dict)]
        if isinstance(devices, list)
        else [],
        pg_config=[p for p in dist.get("pg_config", []) or [] if isinstance(p, dict)]
        if dist
        else [],
    )
    rank = _int_or_none(dist.get("rank")) if dist else None
    if rank is not None and rank >= 0:
        meta.rank = rank
    del doc
    if not len(cols["name"]):
        raise TraceError("trace holds no complete ('X') events")
    frame = _event_frame(cols, base)
    steps = _steps(frame, path, warnings)
    frame["step"] = _narrow(_assign_steps(frame, steps))
    comm = _enrich_comms(frame, cols.pop("comm"), meta)
    del cols
    release_free_memory()  # what building the table freed on the heap
    steps.insert(0, "rank", meta.rank)
    return RankTrace(meta=meta, events=frame, step_rows=steps, comm=comm)


def _to_ns(ts: np.ndarray, base: int) -> np.ndarray:
    """``base`` + ``ts`` (µs) in whole ns. Consumes ``ts`` (its buffer holds the fraction):
    in place, so 3 full-length arrays live at once rather than 5."""
    whole = np.floor(ts)
    np.subtract(ts, whole, out=ts)
    ts *= 1000
    np.rint(ts, out=ts)
    ns = whole.astype(np.int64)
    del whole
    ns *= 1000
    ns += base
    ns += ts.astype(np.int64)
    return ns


def _event_frame(cols: dict[str, Any], base: int) -> pd.DataFrame:
    """The event table, sorted by start time. Takes (pops) the collected columns from
    ``cols`` as it goes, so each is freed once its sorted copy exists, and hands its
    arrays to pandas without a copy (no consolidation into 2-D blocks)."""
    start = _to_ns(cols.pop("ts"), base)
    order = np.argsort(start, kind="stable")  # by start time; "_row" keeps the original index
    start = start[order]
    dur = cols.pop("dur")[order]
    dur *= 1000
    dur_ns = np.rint(dur, out=dur).astype(np.int64)
    del dur
    pid = _str_categorical(cols.pop("pid"), cols["pid_values"], order)
    tid = _str_categorical(cols.pop("tid"), cols["tid_values"], order)
    name = _categorical(cols.pop("name"), cols["name_values"], order)
    cat = _categorical(cols.pop("cat"), cols["cat_values"], order)
    is_gpu = np.isin(cat.codes, _codes_of(cat, cls.GPU_CATS))
    kind = cls.classify(pd.Series(name, copy=False), pd.Series(cat, copy=False))
    thread_ids, thread_of = _thread_ids(pid, tid)
    columns = {
        "name": name,
        "cat": cat,
        "kind": kind,
        "start_ns": start,
        "end_ns": start + dur_ns,
        "dur_ns": dur_ns,
        "pid": pid,
        "tid": tid,
        "stream": cols.pop("stream")[order],
        "is_gpu": is_gpu,
        "correlation": cols.pop("correlation")[order],
        "external_id": cols.pop("external_id")[order],
        "thread_name": _thread_names(pid, tid, thread_ids, thread_of, cols["thread_names"]),
        "main_thread": _main_thread_mask(kind, cat, is_gpu, dur_ns, thread_of),
        "_row": order,  # original position, for the collected comm fields
    }
    return pd.DataFrame(columns, copy=False)


def _codes_of(categorical: pd.Categorical, values: Iterable[str]) -> list[int]:
    categories = categorical.categories
    return [int(i) for i in np.flatnonzero(categories.isin(list(values)))]


def _categorical(codes: np.ndarray, uniques: list, order: np.ndarray) -> pd.Categorical:
    # object-dtype categories: pandas' default arrow strings make every take/mask slower
    categories = pd.Index(np.asarray(uniques, dtype=object), dtype=object)
    return pd.Categorical.from_codes(codes[order], categories=categories)


def _str_categorical(codes: np.ndarray, uniques: list, order: np.ndarray) -> pd.Categorical:
    """Categorical of str(value) from codes into the raw values (ints and strings
    mixed): str() runs once per distinct value."""
    labels = [str(u) for u in uniques]
    distinct = list(dict.fromkeys(labels))
    if len(distinct) != len(labels):  # 7 and "7" both present: merge them
        position = {label: i for i, label in enumerate(distinct)}
        remap = np.array([position[x] for x in labels], dtype=np.int32)
        codes = remap[codes]
    categories = pd.Index(distinct, dtype=object)
    return pd.Categorical.from_codes(codes[order], categories=categories)


def _thread_pair_codes(
    pid: pd.Categorical, tid: pd.Categorical, rows: np.ndarray | None = None
) -> np.ndarray:
    """Each event's (or each of ``rows``') thread as one int:
    ``pid_code * (n_tids + 1) + tid_code``."""
    width = len(tid.categories) + 1
    pids, tids = (pid.codes, tid.codes) if rows is None else (pid.codes[rows], tid.codes[rows])
    pairs = pids.astype(np.int64)
    pairs *= width
    pairs += tids
    return pairs


def _thread_ids(pid: pd.Categorical, tid: pd.Categorical) -> tuple[np.ndarray, np.ndarray]:
    """Distinct threads as pair codes (sorted), and each event's index into them (what
    np.unique(return_inverse=True) gives, through a lookup table over the few possible
    pairs instead of a sort of the whole column)."""
    pairs = _thread_pair_codes(pid, tid)
    size = len(pid.categories) * (len(tid.categories) + 1)
    if not len(pairs) or pairs.min() < 0 or size > 1 << 22:
        thread_ids, thread_of = np.unique(pairs, return_inverse=True)
        return thread_ids, thread_of.ravel()
    present = np.zeros(size, dtype=bool)
    present[pairs] = True
    thread_ids = np.flatnonzero(present).astype(pairs.dtype)
    index = np.zeros(size, dtype=np.intp)
    index[thread_ids] = np.arange(len(thread_ids))
    return thread_ids, index[pairs]


def _thread_names(
    pid: pd.Categorical,
    tid: pd.Categorical,
    thread_ids: np.ndarray,
    thread_of: np.ndarray,
    names: dict[tuple[str, str], str],
) -> pd.Categorical:
    width = len(tid.categories) + 1
    labels = [
        names.get((str(pid.categories[t // width]), str(tid.categories[t % width])), "")
        for t in thread_ids
    ]
    codes, uniques = pd.factorize(np.asarray(labels, dtype=object))
    return pd.Categorical.from_codes(codes[thread_of], categories=pd.Index(uniques, dtype=object))


def _main_thread_mask(
    kind: pd.Categorical,
    cat: pd.Categorical,
    is_gpu: np.ndarray,
    dur_ns: np.ndarray,
    thread_of: np.ndarray,
) -> np.ndarray:
    """The training thread: the one running ProfilerStep, else the most cpu_op time."""
    cpu = ~is_gpu
    pool = cpu & np.asarray(kind == "step")  # no object array of the kinds
    if not pool.any():
        pool = cpu & np.isin(cat.codes, _codes_of(cat, ["cpu_op"]))
    if not pool.any():
        pool = cpu
    if not pool.any():
        return np.zeros(len(is_gpu), dtype=bool)
    busy = np.bincount(thread_of[pool], weights=dur_ns[pool], minlength=thread_of.max() + 1)
    return (thread_of == int(busy.argmax())) & cpu


def _steps(events: pd.DataFrame, path: Path, warnings: list[str]) -> pd.DataFrame:
    marks = events[(events["kind"] == "step") & events["main_thread"]]
    numbers = _step_numbers(marks["name"].astype(str).to_numpy())
    if (numbers < 0).any():
        bad = marks["name"].astype(str).to_numpy()[numbers < 0]
        warnings.append(
            BadInput(
                f"{path}: ignored {len(bad)} step marker(s) without a step number in 0..2**63 "
                f"(first: {str(bad[0])[:60]!r})"
            )
        )
        marks, numbers = marks[numbers >= 0], numbers[numbers >= 0]
    if marks.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS[1:]})
    steps = pd.DataFrame(
        {
            "step": numbers,
            "start_ns": marks["start_ns"].to_numpy(),
            "end_ns": marks["end_ns"].to_numpy(),
        }
    ).sort_values("start_ns", ignore_index=True)
    steps = steps.drop_duplicates("step", keep="first").reset_index(drop=True)
    # The profiler's last prof.step() opens a step that the context exit closes at once.
    dur = steps["end_ns"] - steps["start_ns"]
    if len(steps) > 1 and dur.iloc[-1] < 0.05 * dur.iloc[:-1].median():
        steps = steps.iloc[:-1].reset_index(drop=True)
    return steps


def _step_numbers(names: np.ndarray) -> np.ndarray:
    """N of each ``ProfilerStep#N``; -1 where N is not a non-negative int64."""
    out = np.full(len(names), -1, dtype=np.int64)
    for i, name in enumerate(names):
        m = _STEP_RE.match(name)
        if m and len(m.group(1)) < 19:
            out[i] = int(m.group(1))
    return out


def _assign_steps(events: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Step of each event: CPU events by start time; GPU events by the step of the CPU
    launch they correlate with (a kernel may run after its step's CPU side ended)."""
    out = np.full(len(events), -1, dtype=np.int64)
    if steps.empty:
        return out
    starts = steps["start_ns"].to_numpy()
    ends = steps["end_ns"].to_numpy()
    numbers = steps["step"].to_numpy()
    t = events["start_ns"].to_numpy()
    idx = np.searchsorted(starts, t, side="right") - 1
    inside = (idx >= 0) & (t < ends[np.clip(idx, 0, None)])
    out[inside] = numbers[idx[inside]]
    gpu = events["is_gpu"].to_numpy()
    corr = events["correlation"].to_numpy()
    launches = ~gpu & (corr >= 0) & (out >= 0)
    if launches.any() and gpu.any():
        by_corr = pd.Series(out[launches], index=corr[launches])
        by_corr = by_corr[~by_corr.index.duplicated()]
        mapped = by_corr.reindex(corr[gpu]).to_numpy()
        gpu_steps = out[gpu]
        have = ~np.isnan(mapped)
        gpu_steps[have] = mapped[have].astype(np.int64)
        out[gpu] = gpu_steps
    return out


def _enrich_comms(
    events: pd.DataFrame, stored: dict[str, np.ndarray], meta: TraceMeta
) -> pd.DataFrame:
    """The comm rows' fields (op, bytes, dtype, group, group size, seq): the table
    ``RankTrace.comm``, over the comm rows only (as full-length columns they cost ~48
    bytes per event, though a few % of the events are collectives). Removes ``_row``.
    ``stored``: the collector's fields of the rows with telling args (``_row``: their
    original positions, ascending); other comm rows get what their name says."""
    kind = events["kind"].array
    comm_rows = np.flatnonzero(np.isin(kind.codes, _codes_of(kind, ["comm", "comm_cpu"])))
    fields = _empty_fields(len(comm_rows))
    if len(comm_rows):
        rows = events["_row"].to_numpy()[comm_rows]
        known = stored["_row"]
        at = np.minimum(np.searchsorted(known, rows), max(len(known) - 1, 0))
        found = known[at] == rows if len(known) else np.zeros(len(rows), dtype=bool)
        for name in (*_COMM_FIELDS, _DTYPE_GUESS):
            fields[name][found] = stored[name][at[found]]
        _fill_from_names(events, fields, comm_rows, np.flatnonzero(~found))
        _fill_kernels_from_cpu(events, fields, comm_rows)
        dtype, guess = fields["comm_dtype"], fields[_DTYPE_GUESS]
        fields["comm_dtype"] = np.where(pd.notna(dtype), dtype, guess)
        _bytes_from_nelems(fields)
        _fill_group_defaults(fields, meta)
    del events["_row"]
    return _comm_table(comm_rows, fields)


def _fill_from_names(
    events: pd.DataFrame, fields: dict[str, np.ndarray], comm_rows: np.ndarray, pos: np.ndarray
) -> None:
    """Comm rows (at ``pos`` in ``fields``) without telling args: the fields their name
    (and kernel-ness) give."""
    rows = comm_rows[pos]
    name = events["name"].array
    cat = events["cat"].array
    is_kernel = cat.codes[rows] == (_codes_of(cat, ["kernel"]) or [-2])[0]
    key = name.codes[rows].astype(np.int64) * 2 + is_kernel
    distinct, first = np.unique(key, return_index=True)
    for k, i in zip(distinct, first, strict=True):
        r = _comm_row(str(name.categories[int(k) // 2]), bool(is_kernel[i]), _NO_ARGS)
        where = pos[key == k]
        for column, value in zip((*_COMM_FIELDS, _DTYPE_GUESS), r, strict=True):
            fields[column][where] = value


def _fill_kernels_from_cpu(
    events: pd.DataFrame, fields: dict[str, np.ndarray], comm_rows: np.ndarray
) -> None:
    """GPU comm kernels get what only the CPU-side op knows (RCCL's ``Generic`` type,
    ``all_to_all`` run as SendRecv, sizes, group): kernel -> its launch (correlation) ->
    the innermost enclosing c10d/nccl/record_param_comms op, on the launching thread,
    that has the value. ``fields`` are over ``comm_rows``."""
    kind = events["kind"].array
    comm_kind = kind.codes[comm_rows]
    gpu = events["is_gpu"].to_numpy()
    corr = events["correlation"].to_numpy()
    is_comm = comm_kind == (_codes_of(kind, ["comm"]) or [-2])[0]
    kernel_pos = np.flatnonzero(is_comm & gpu[comm_rows] & (corr[comm_rows] >= 0))
    cpu_pos = np.flatnonzero(comm_kind == (_codes_of(kind, ["comm_cpu"]) or [-2])[0])
    if len(kernel_pos) == 0 or len(cpu_pos) == 0:
        return
    kernel_rows, cpu_rows = comm_rows[kernel_pos], comm_rows[cpu_pos]
    launch_rows = np.flatnonzero(~gpu & np.isin(corr, corr[kernel_rows]))
    launch_of = pd.Series(launch_rows, index=corr[launch_rows])
    launch_of = launch_of[~launch_of.index.duplicated()]
    launch = launch_of.reindex(corr[kernel_rows]).to_numpy()
    found = ~np.isnan(launch)
    kernel_pos, launch = kernel_pos[found], launch[found].astype(np.int64)
    if len(kernel_pos) == 0:
        return
    start = events["start_ns"].to_numpy()
    end = events["end_ns"].to_numpy()
    pid, tid = events["pid"].array, events["tid"].array
    k_thread, k_time = _thread_pair_codes(pid, tid, launch), start[launch]
    c_thread = _thread_pair_codes(pid, tid, cpu_rows)
    c_start, c_end = start[cpu_rows], end[cpu_rows]
    # The innermost enclosing op starts last: compared as each op's start rank (int32),
    # the kernels x cpu-ops matrix of starts costs 4 bytes a cell instead of 8.
    c_rank = np.unique(c_start, return_inverse=True)[1].ravel().astype(np.int32)
    block = max(1, 2_000_000 // len(cpu_rows))  # bounded kernels x cpu-ops matrices
    for lo in range(0, len(kernel_pos), block):
        sl = slice(lo, lo + block)
        inside = (
            (k_thread[sl, None] == c_thread[None, :])
            & (c_start[None, :] <= k_time[sl, None])
            & (c_end[None, :] >= k_time[sl, None])
        )
        _fill_from_enclosing(fields, kernel_pos[sl], cpu_pos, inside, c_rank)


def _fill_from_enclosing(
    fields: dict[str, np.ndarray],
    kernel_rows: np.ndarray,
    cpu_rows: np.ndarray,
    inside: np.ndarray,
    c_rank: np.ndarray,
) -> None:
    """Each kernel's (``inside``'s rows) value from the enclosing cpu op (columns) that
    has one and starts last (highest ``c_rank``; the first such column on a tie)."""
    for column in ("comm_op", "comm_nelems", "comm_dtype", "pg_name", "pg_size", "seq"):
        values = fields[column]
        has = pd.notna(values[cpu_rows])
        valid = inside & has[None, :]
        hit = valid.any(axis=1)
        if not hit.any():
            continue
        innermost = np.where(valid, c_rank[None, :], np.int32(-1)).argmax(axis=1)
        rows = kernel_rows[hit]
        source = values[cpu_rows[innermost[hit]]]
        current = values[rows]
        if column == "comm_op":
            values[rows] = _prefer_cpu_op(current, source)
        else:
            values[rows] = np.where(pd.notna(current), current, source)


def _prefer_cpu_op(kernel_ops: np.ndarray, cpu_ops: np.ndarray) -> np.ndarray:
    # SendRecv kernels also run all_to_all; Generic kernels have no type at all
    keep_kernel = np.array([o not in (None, "send_recv") for o in kernel_ops], dtype=bool)
    return np.where(keep_kernel, kernel_ops, cpu_ops)


def _bytes_from_nelems(fields: dict[str, np.ndarray]) -> None:
    nbytes, nelems = fields["comm_bytes"], fields["comm_nelems"]
    missing = np.flatnonzero(np.isnan(nbytes) & ~np.isnan(nelems))
    if len(missing) == 0:
        return
    sizes = [cls.dtype_size(d) or np.nan for d in fields["comm_dtype"][missing]]
    nbytes[missing] = nelems[missing] * np.asarray(sizes, dtype=np.float64)


def _fill_group_defaults(fields: dict[str, np.ndarray], meta: TraceMeta) -> None:
    pg, pg_size = fields["pg_name"], fields["pg_size"]  # over the comm rows
    # without a recorded group, everything ran on the default group "0"
    pg[pd.isna(pg)] = "0"
    need = np.flatnonzero(np.isnan(pg_size))
    if len(need) == 0:
        return
    sizes = {str(p.get("pg_name")): _num(p.get("pg_size")) for p in meta.pg_config}
    default = float(meta.world_size) if meta.world_size else np.nan
    known = [sizes.get(str(p)) for p in pg[need]]
    pg_size[need] = [default if k is None else k for k in known]
