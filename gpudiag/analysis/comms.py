"""Collectives: one row per collective per rank, bandwidth with the nccl-tests factors,
per-op summary, DDP bucket timeline and the all-reduce stall after backward.

Sources, in order of preference:

* a gpudiag run's ``collectives`` table (Flight Recorder et al.): every collective of the
  run with its sequence number, not only the profiled window;
* GPU traces: comm kernels (start/end on the GPU, op/bytes/group from the kernel's args
  or the CPU-side op it was launched from, see trace_table.py);
* CPU (gloo) traces: the ``c10d::*`` op on the training thread (when the rank arrives)
  paired in order with gloo's ``gloo:*`` transfer on its runloop thread (when it ends).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import classify as cls
from gpudiag.analysis import intervals as iv
from gpudiag.analysis.breakdown import activity_sets
from gpudiag.analysis.fold import iter_rank_rows
from gpudiag.analysis.matching import Table, concat_pieces, match_groups, rank_blocks
from gpudiag.analysis.spill import SpilledTable, SpillFile
from gpudiag.analysis.store import CallStore, median_sql
from gpudiag.analysis.trace_model import RankTrace, outermost_calls, with_comm

TABLE_COLUMNS = (
    "rank",
    "pg_name",
    "pg_size",
    "seq",
    "index",
    "op",
    "bytes",
    "dtype",
    "start_ns",
    "end_ns",
    "dur_ms",
    "algbw_gbs",
    "busbw_gbs",
    "peak_gbs",
    "link",
    "step",
    "source",
)
# The columns of the collective table each cross-rank analysis reads (a many-rank run's
# table is read back from disk by these alone: pipeline.analyze, spill.SpilledTable)
SUMMARY_READS = ("op", "pg_name", "rank", "bytes", "dur_ms", "busbw_gbs", "peak_gbs")
BUCKET_READS = ("op", "rank", "step", "bytes", "start_ns", "end_ns", "dur_ms")
STALL_READS = ("op", "rank", "step", "start_ns", "end_ns", "bytes")
WAIT_READS = ("rank", "pg_name", "pg_size", "seq", "index", "op", "start_ns", "end_ns")
# allreduce_stall's rows
STALL_COLUMNS = ("rank", "step", "stall_ms", "buckets", "last_bucket_bytes")
SUMMARY_COLUMNS = (
    "op",
    "pg_name",
    "count",
    "bytes",
    "total_ms",
    "busbw_gbs_median",
    "peak_gbs",
    "ranks",
)

# nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor(n)
_TWO_WAY = {"all_reduce"}
_ONE_WAY = {"all_gather", "reduce_scatter", "all_to_all"}

# per-direction peak of one GPU's fabric (GB/s), matched on deviceProperties' name
_LINK_PEAKS = (
    ("B200", "NVLink 5", 900.0),
    ("B100", "NVLink 5", 900.0),
    ("H200", "NVLink 4", 450.0),
    ("H100", "NVLink 4", 450.0),
    ("H800", "NVLink 4 (H800)", 200.0),
    ("A100-SXM", "NVLink 3", 300.0),
    ("A800", "NVLink 3 (A800)", 200.0),
    ("V100-SXM", "NVLink 2", 150.0),
    ("MI300", "Infinity Fabric", 448.0),
    ("MI250", "Infinity Fabric", 400.0),
)


def busbw_factor(op: str | None, n: float) -> float:
    if not n or n != n or n < 1:
        return float("nan")
    if op in _TWO_WAY:
        return 2.0 * (n - 1) / n
    if op in _ONE_WAY:
        return (n - 1) / n
    return 1.0


def busbw_factors(ops: pd.Series, n: pd.Series) -> np.ndarray:
    """:func:`busbw_factor` of each (op, group size) pair, as one array operation."""
    size = pd.to_numeric(n, errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        factors = np.where(
            ops.isin(_TWO_WAY).to_numpy(dtype=bool),
            2.0 * (size - 1) / size,
            np.where(ops.isin(_ONE_WAY).to_numpy(dtype=bool), (size - 1) / size, 1.0),
        )
    return np.where(np.isnan(size) | (size < 1), np.nan, factors)


def link_of(trace: RankTrace | None) -> tuple[str, float]:
    """(link description, per-direction peak GB/s) from the trace's device name."""
    if trace is None:
        return ("unknown", float("nan"))
    if not trace.meta.device_properties:
        if trace.meta.backend == "gloo":
            return ("host network (gloo)", float("nan"))
        return ("unknown", float("nan"))
    name = str(trace.meta.device_properties[0].get("name", ""))
    for key, link, peak in _LINK_PEAKS:
        if key in name:
            return (f"{link} ({name})", peak)
    if "PCIe" in name:
        return (f"PCIe ({name})", 32.0)
    return (f"unknown ({name})", float("nan"))


# --------------------------------------------------------------------------- per-rank rows


def _gpu_rows(events: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """``comm``: the trace's ``RankTrace.comm`` (the collectives' fields)."""
    rows = with_comm(events[events["is_gpu"].to_numpy() & (cls.kinds(events) == "comm")], comm)
    return pd.DataFrame(
        {
            "pg_name": rows["pg_name"].to_numpy(dtype=object),
            "pg_size": rows["pg_size"].to_numpy(dtype=float),
            "seq": rows["seq"].to_numpy(dtype=float),
            "op": rows["comm_op"].to_numpy(dtype=object),
            "bytes": rows["comm_bytes"].to_numpy(dtype=float),
            "dtype": rows["comm_dtype"].to_numpy(dtype=object),
            "start_ns": rows["start_ns"].to_numpy(),
            "end_ns": rows["end_ns"].to_numpy(),
            "step": rows["step"].to_numpy(),
            "source": "trace:kernel",
        }
    )


def _cpu_rows(events: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """gloo: pair the k-th ``c10d::`` enqueue with the k-th ``gloo:`` transfer."""
    kind = cls.kinds(events)
    c10d = cls.name_mask(events["name"], lambda names: names.str.startswith("c10d::"))
    enq = with_comm(events[(kind == "comm_cpu") & c10d], comm)
    enq = enq[enq["comm_op"].notna().to_numpy()]
    enq = outermost_calls(enq)
    xfer = with_comm(events[(kind == "comm") & ~events["is_gpu"].to_numpy()], comm)
    if enq.empty and xfer.empty:
        return _gpu_rows(events.iloc[0:0], comm)
    if len(enq) == len(xfer) or xfer.empty or enq.empty:
        base = enq if len(enq) else xfer
        ends = xfer["end_ns"].to_numpy() if len(xfer) == len(base) else base["end_ns"].to_numpy()
        nbytes = base["comm_bytes"].to_numpy(dtype=float)
        if len(xfer) == len(base):
            nbytes = np.where(np.isnan(nbytes), xfer["comm_bytes"].to_numpy(dtype=float), nbytes)
    else:
        base = enq
        m = pd.merge_asof(
            xfer[["start_ns", "end_ns", "comm_bytes"]].rename(columns={"start_ns": "x_start"}),
            enq[["start_ns"]].assign(k=np.arange(len(enq))),
            left_on="x_start",
            right_on="start_ns",
            direction="backward",
        ).dropna(subset=["k"])
        m = m.drop_duplicates("k", keep="first")
        ends = base["end_ns"].to_numpy().copy()
        nbytes = base["comm_bytes"].to_numpy(dtype=float).copy()
        k = m["k"].to_numpy(dtype=np.int64)
        ends[k] = m["end_ns"].to_numpy()
        nbytes[k] = np.where(np.isnan(nbytes[k]), m["comm_bytes"].to_numpy(dtype=float), nbytes[k])
    return pd.DataFrame(
        {
            "pg_name": base["pg_name"].to_numpy(dtype=object),
            "pg_size": base["pg_size"].to_numpy(dtype=float),
            "seq": base["seq"].to_numpy(dtype=float),
            "op": base["comm_op"].to_numpy(dtype=object),
            "bytes": nbytes,
            "dtype": base["comm_dtype"].to_numpy(dtype=object),
            "start_ns": base["start_ns"].to_numpy(),
            "end_ns": np.maximum(ends, base["start_ns"].to_numpy()),
            "step": base["step"].to_numpy(),
            "source": "trace:cpu",
        }
    )


def trace_rows(trace: RankTrace) -> pd.DataFrame:
    """The rank's collectives from its trace (cached on it, see trace_model.RankTrace.cached)."""
    rows = trace.cached("collective_rows", lambda: _trace_rows(trace)).copy()
    rows.insert(0, "rank", trace.meta.rank)
    return rows


def _trace_rows(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    kind = cls.kinds(ev)
    gpu = ev["is_gpu"].to_numpy()
    if (gpu & (kind == "comm")).any():
        rows = _gpu_rows(ev, trace.comm)
    elif (~gpu & (kind == "comm")).any() or not _host_calls_only(trace):
        rows = _cpu_rows(ev, trace.comm)
    else:  # c10d:: calls that moved no data: their durations are no collective's
        rows = _gpu_rows(ev.iloc[0:0], trace.comm)
    link, peak = link_of(trace)
    rows["link"] = link
    rows["peak_gbs"] = peak
    return rows


def _host_calls_only(trace: RankTrace) -> bool:
    """Without comm kernels or gloo transfers, a GPU trace's (or a world of one's)
    ``c10d::`` ops are host-side calls only: NCCL with one rank returns at once, and on
    a GPU the collective would be a kernel. Their durations are not collectives'."""
    from gpudiag.analysis.breakdown import is_gpu_trace

    return trace.meta.world_size == 1 or is_gpu_trace(trace.events)


def _run_rows(run: Any, traces: list[RankTrace]) -> pd.DataFrame:
    """Rows from a gpudiag run's collectives table; arrival = enqueue (else start)."""
    from gpudiag.analysis.classify import normalise_op

    c = getattr(run, "collectives", None)
    if c is None or len(c) == 0 or "rank" not in c:
        return pd.DataFrame()
    c = c.copy()
    for col in ("start_ns", "end_ns", "enqueue_ns", "in_bytes", "out_bytes", "seq", "pg_size"):
        c[col] = pd.to_numeric(c[col], errors="coerce") if col in c else np.nan
    for col in ("op", "dtype", "pg_name", "source", "step"):
        if col not in c:
            c[col] = None
    ops = c["op"].map(lambda o: normalise_op(o) or (str(o) if o is not None else None))
    rank = pd.to_numeric(c["rank"], errors="coerce")
    links = {t.meta.rank: link_of(t) for t in traces}
    rows = pd.DataFrame(
        {
            "rank": rank,
            "pg_name": c["pg_name"].astype(object).where(c["pg_name"].notna(), "0"),
            "pg_size": c["pg_size"],
            "seq": c["seq"],
            "op": ops,
            "bytes": c[["in_bytes", "out_bytes"]].max(axis=1),
            "dtype": c["dtype"],
            "start_ns": c["enqueue_ns"].fillna(c["start_ns"]),
            "end_ns": c["end_ns"],
            "step": pd.to_numeric(c["step"], errors="coerce").fillna(-1),
            # who timed the call, when someone did (dist: the Python API's wrapper; a DDP
            # comm hook), else who recorded it (flight_recorder)
            "source": "run:"
            + c.get("time_source", pd.Series(None, index=c.index, dtype=object))
            .fillna(c["source"])
            .fillna("unknown")
            .astype(str),
            "link": rank.map(lambda r: links.get(r, ("unknown", np.nan))[0]),
            "peak_gbs": rank.map(lambda r: links.get(r, ("unknown", np.nan))[1]).astype(float),
        }
    )
    rows = rows.dropna(subset=["rank", "start_ns"])
    rows["rank"] = rows["rank"].astype(np.int64)
    rows["start_ns"] = rows["start_ns"].astype(np.int64)
    rows["step"] = rows["step"].astype(np.int64)
    return rows


# --------------------------------------------------------------------------- public


def collective_table(traces: list[RankTrace], run: Any = None) -> pd.DataFrame:
    """One row per collective per rank, with algbw/busbw (GB/s = bytes/ns)."""
    pieces = list(collective_pieces(traces, run))
    return pieces[0] if len(pieces) == 1 else pd.concat(pieces, ignore_index=True)


# Calls per piece of the collective table as it is made (whole ranks: spilled piece by
# piece, the whole table is never in the client's memory, pipeline.analyze)
TABLE_PIECE_ROWS = 1 << 16


def collective_pieces(
    traces: list[RankTrace], run: Any = None, rows: int = TABLE_PIECE_ROWS
) -> Iterator[pd.DataFrame]:
    """:func:`collective_table` in pieces, in its order: whole ranks, about ``rows``
    calls each, where the traces come in rank order (else, and from a run's own table,
    one piece). ``pd.concat`` of the pieces is the table."""
    from_run = _run_rows(run, traces) if run is not None else pd.DataFrame()
    # The run's table covers every step; without end times (gloo, no --time-buckets;
    # NCCL) it still gives arrivals for skew, but a trace's window has real durations.
    if len(from_run) and (from_run["end_ns"].notna().any() or not traces):
        yield _with_bandwidth(from_run)
        return
    ranks = [int(t.meta.rank) for t in traces]
    if any(a >= b for a, b in itertools.pairwise(ranks)):
        rows = 0  # a rank's rows may be anywhere: one piece, sorted as a whole
    frames: list[pd.DataFrame] = []
    held = 0
    made = False
    for frame in iter_rank_rows(traces, "collective_rows", trace_rows, max_rows=rows or None):
        if not len(frame):
            continue
        frames.append(frame)
        held += len(frame)
        if rows and held >= rows:
            yield _with_bandwidth(_joined(frames))
            frames, held, made = [], 0, True
    if frames:
        yield _with_bandwidth(_joined(frames))
    elif not made and len(from_run):
        # no transfer in the traces (NCCL with one rank launches no kernel): the calls
        # are still the run's, without durations
        yield _with_bandwidth(from_run)
    elif not made:
        yield pd.DataFrame({c: pd.Series(dtype=object) for c in TABLE_COLUMNS})


def _joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _with_bandwidth(table: pd.DataFrame) -> pd.DataFrame:
    """The table's rows in (rank, time) order, with each call's index in its rank's
    group, duration and bandwidths: TABLE_COLUMNS."""
    if not _in_rank_and_time_order(table):  # usually they are: sorting copies the table
        table = table.sort_values(["rank", "start_ns"], kind="stable", ignore_index=True)
    table["pg_name"] = table["pg_name"].fillna("0").astype(str)
    table["index"] = table.groupby(["rank", "pg_name"]).cumcount()
    dur_ns = (table["end_ns"].astype(float) - table["start_ns"].astype(float)).clip(lower=0)
    table["dur_ms"] = dur_ns / 1e6
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur_ns > 0, table["bytes"].astype(float) / dur_ns, np.nan)
    factors = busbw_factors(table["op"], table["pg_size"])
    table["algbw_gbs"] = algbw
    table["busbw_gbs"] = algbw * factors
    return table[list(TABLE_COLUMNS)]


def _in_rank_and_time_order(table: pd.DataFrame) -> bool:
    """Whether the rows are sorted by (rank, start_ns) already."""
    rank = table["rank"].to_numpy()
    start = table["start_ns"].to_numpy()
    if rank.dtype.kind not in "iu" or start.dtype.kind not in "iu" or len(table) < 2:
        return len(table) < 2
    rank_step, start_step = np.diff(rank), np.diff(start)
    return bool(((rank_step > 0) | ((rank_step == 0) & (start_step >= 0))).all())


_SUMMARY_KEYS = ("op", "pg_name")


def collective_summary(calls: Table | CallStore) -> pd.DataFrame:
    """Per (op, group): count and total_ms per rank (mean over ranks), median bytes per
    collective, median busbw, the link's peak, the ranks with a call. One query of the
    call store (a table is put in a store of its own first): the client holds the
    summary's rows, not the calls."""
    if not isinstance(calls, CallStore):
        if calls is None or len(calls) == 0:
            return _no_summary()
        with CallStore.of(calls) as store:
            return collective_summary(store)
    out = calls.query(_SUMMARY_SQL)
    if not len(out):
        return _no_summary()
    out = out.astype({"ranks": np.int64}).sort_values(list(_SUMMARY_KEYS), ignore_index=True)
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[list(SUMMARY_COLUMNS)]


def _no_summary() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in SUMMARY_COLUMNS})


# The calls of each (op, group), an op unknown where none is named
_NAMED_CALLS = "SELECT coalesce(op, 'unknown') AS op, * EXCLUDE (op) FROM calls"
_SUMMARY_SQL = f"""
    WITH per AS (
        SELECT op, pg_name, count(*) AS calls, count(DISTINCT rank) AS ranks,
            coalesce(fsum(dur_ms), 0.0) AS total, max(peak_gbs) AS peak_gbs
        FROM ({_NAMED_CALLS}) WHERE pg_name IS NOT NULL GROUP BY op, pg_name
    ),
    sizes AS ({median_sql(_NAMED_CALLS, ["op", "pg_name"], "bytes")}),
    bandwidths AS ({median_sql(_NAMED_CALLS, ["op", "pg_name"], "busbw_gbs")})
    SELECT per.op, per.pg_name,
        CAST(calls AS DOUBLE) / ranks AS count,
        sizes.median AS bytes,
        total / ranks AS total_ms,
        bandwidths.median AS busbw_gbs_median,
        peak_gbs, ranks
    FROM per
    LEFT JOIN sizes USING (op, pg_name)
    LEFT JOIN bandwidths USING (op, pg_name)
"""


WALL_COLUMNS = (
    "op",
    "pg_name",
    "caller",
    "calls_per_step",
    "timed_share",
    "bytes_median_per_call",
    "wall_ms_per_step",
    "summed_ms_per_step",
    "ranks",
    "op_wall_ms_min",
    "op_wall_min_rank",
    "op_wall_ms_max",
    "op_wall_max_rank",
)
_USER_SOURCES = ("run:dist",)
_HOOK_SOURCES = ("run:ddp_hook", "run:user_comm_hook")


def collective_caller(table: pd.DataFrame) -> np.ndarray:
    """Who issued each call: ``user`` (through torch.distributed's Python API, which a
    gpudiag run times), ``ddp`` (DDP's gradient buckets: timed by its comm hook, or an
    all-reduce inside a step that did not go through the Python API: DDP's C++ reducer),
    ``internal`` (other calls outside the Python API: DDP's start-up parameter
    broadcasts) or ``unknown`` (a trace's calls: the caller is not recorded)."""
    source = table["source"].astype(str).to_numpy()
    op = table["op"].astype(object).to_numpy()
    step = pd.to_numeric(table["step"], errors="coerce").fillna(-1).to_numpy()
    run = np.char.startswith(source.astype(str), "run:")
    user = np.isin(source, _USER_SOURCES)
    hook = np.isin(source, _HOOK_SOURCES)
    reducer = run & ~user & ~hook & (op == "all_reduce") & (step >= 0)
    return np.select(
        [user, hook | reducer, run], ["user", "ddp", "internal"], default="unknown"
    ).astype(object)


def collective_wall_per_step(table: pd.DataFrame) -> pd.DataFrame:
    """Per (op, group, caller): how long collectives run per step as wall time, the
    union of the calls' intervals in each step (overlapping DDP buckets count once),
    mean over each rank's steps, then over ranks; beside it the sum of the calls'
    durations (``summed_ms_per_step``, what overlapping calls exceed the step with).
    DDP's bucket traffic and the user's own calls are kept apart (``caller``): a run's
    table times the user's calls but not DDP's C++ buckets (``timed_share``, the share
    of calls with an end time; ``wall_ms_per_step`` NaN where none has one).
    ``bytes_median_per_call`` is the median size of one call. Steps: the step windows
    the calls carry (``step`` >= 0); a rank's steps are those any of its calls carry.
    The spread over ranks, per (op, group), every caller's wall summed per rank (the
    mean hides it: a straggler's peers wait 42 ms in an all-reduce the straggler spends
    0.7 ms in): ``op_wall_ms_min`` of ``op_wall_min_rank`` and ``op_wall_ms_max`` of
    ``op_wall_max_rank`` (the lowest rank on ties), NaN where no call is timed."""
    return collective_wall_of_pieces(lambda: [] if table is None else [table])


def collective_wall_of_pieces(pieces: Callable[[], Iterable[pd.DataFrame]]) -> pd.DataFrame:
    """:func:`collective_wall_per_step` of the table ``pieces()`` gives a piece at a time
    (SpilledTable.pieces of comms.collective_pieces: whole ranks), holding one piece and
    a few numbers per rank and (op, group, caller), not the whole table (a 16,384-rank
    Megatron-shaped run: 1.4 M calls, 0.47 GiB as one frame). Where a rank's rows are
    in more than one piece, the pieces are joined and read as one."""
    totals = _WallTotals()
    partials: list[pd.DataFrame] = []
    seen: set[int] = set()
    for piece in pieces():
        ranks = set(pd.unique(piece["rank"]).tolist()) if len(piece) else set()
        if ranks & seen:  # not whole ranks: the whole table at once
            return collective_wall_of_pieces(_joined_pieces(pieces))
        seen |= ranks
        partials += _rank_walls(piece, totals)
    if not totals.calls:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in WALL_COLUMNS})
    return _wall_rows(pd.concat(partials, ignore_index=True) if partials else None, totals)


def _joined_pieces(
    pieces: Callable[[], Iterable[pd.DataFrame]],
) -> Callable[[], list[pd.DataFrame]]:
    whole = pd.concat(list(pieces()), ignore_index=True)
    return lambda: [whole]


_WALL_KEYS = ["op", "pg_name", "caller"]
_PARTIAL_COLUMNS = [*_WALL_KEYS, "rank", "calls", "timed", "wall", "summed"]


class _WallTotals:
    """Per (op, group, caller), over every piece: its calls, those timed, and how many
    calls had each size (the median's input, as distinct values and their counts)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[Any, ...], int] = {}
        self.timed: dict[tuple[Any, ...], int] = {}
        self.sizes: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}

    def add(self, key: tuple[Any, ...], group: pd.DataFrame) -> None:
        self.calls[key] = self.calls.get(key, 0) + len(group)
        self.timed[key] = self.timed.get(key, 0) + int(group["timed"].sum())
        values = pd.to_numeric(group["bytes"]).to_numpy(dtype=float)
        values, counts = np.unique(values[~np.isnan(values)], return_counts=True)
        if key in self.sizes:
            held, held_counts = self.sizes[key]
            values, where = np.unique(np.concatenate([held, values]), return_inverse=True)
            counts = np.bincount(where, weights=np.concatenate([held_counts, counts]))
        self.sizes[key] = (values, counts.astype(np.int64))

    def timed_share(self, key: tuple[Any, ...]) -> float:
        return float(np.float64(self.timed[key]) / self.calls[key])

    def median(self, key: tuple[Any, ...]) -> float:
        """pandas' median of the key's sizes, from their counts."""
        values, counts = self.sizes[key]
        n = int(counts.sum())
        if n == 0:
            return float("nan")
        ends = np.cumsum(counts)
        upper = values[int(np.searchsorted(ends, n // 2, side="right"))]
        if n % 2:
            return float(upper)
        lower = values[int(np.searchsorted(ends, n // 2 - 1, side="right"))]
        return float(pd.Series([lower, upper], dtype=float).median())


def _rank_walls(table: pd.DataFrame, totals: _WallTotals) -> list[pd.DataFrame]:
    """Per (op, group, caller) and rank of these whole ranks' calls: calls per step, and
    where any call is timed, the wall and summed time per step (NaN where none is); the
    key's calls, timed calls and sizes go to ``totals``."""
    if len(table) == 0:
        return []
    t = table.loc[pd.to_numeric(table["step"], errors="coerce").fillna(-1) >= 0].copy()
    if t.empty:
        return []
    t["op"] = t["op"].fillna("unknown")
    t["caller"] = collective_caller(t)
    t["step"] = t["step"].astype(np.int64)
    start = pd.to_numeric(t["start_ns"], errors="coerce")
    end = pd.to_numeric(t["end_ns"], errors="coerce")
    t["timed"] = end.notna() & start.notna() & (end >= start)
    steps_of_rank = t.groupby("rank")["step"].nunique()
    rows = []
    for key, g in t.groupby(_WALL_KEYS, sort=True):
        totals.add(key, g)
        for rank, r in g.groupby("rank"):
            n_steps = int(steps_of_rank[rank])
            timed = r[r["timed"].to_numpy()]
            wall = summed = np.nan
            if not timed.empty:
                wall = _wall_ns(timed) / 1e6 / n_steps
                summed = float(timed["dur_ms"].astype(float).sum()) / n_steps
            rows.append((*key, rank, len(r) / n_steps, not timed.empty, wall, summed))
    return [pd.DataFrame(rows, columns=_PARTIAL_COLUMNS)]


def _wall_ns(timed: pd.DataFrame) -> int:
    """The union of the calls' intervals in each step, summed over the steps."""
    wall = 0
    for _, s in timed.groupby("step"):
        union = iv.union(
            s["start_ns"].to_numpy(dtype=np.int64), s["end_ns"].to_numpy(dtype=np.int64)
        )
        wall += iv.length(union)
    return wall


def _wall_rows(partials: pd.DataFrame | None, totals: _WallTotals) -> pd.DataFrame:
    """The rows of collective_wall_per_step from the per-rank figures, keys in order."""
    order = pd.DataFrame(list(totals.calls), columns=_WALL_KEYS).groupby(_WALL_KEYS, sort=True)
    by_key = {} if partials is None else dict(list(partials.groupby(_WALL_KEYS, sort=True)))
    empty = pd.DataFrame(columns=_PARTIAL_COLUMNS)
    rows = []
    for key in order.size().index:
        g = by_key.get(key, empty).sort_values("rank", kind="stable")
        timed = g["timed"].to_numpy(dtype=bool)
        wall = g["wall"].to_numpy(dtype=float)[timed]
        summed = g["summed"].to_numpy(dtype=float)[timed]
        rows.append(
            {
                **dict(zip(_WALL_KEYS, key, strict=True)),
                "calls_per_step": float(np.mean(g["calls"].to_numpy(dtype=float))),
                "timed_share": totals.timed_share(key),
                "bytes_median_per_call": totals.median(key),
                "wall_ms_per_step": float(np.mean(wall)) if len(wall) else np.nan,
                "summed_ms_per_step": float(np.mean(summed)) if len(summed) else np.nan,
                "ranks": int(g["rank"].nunique()),
            }
        )
    op_walls = _op_walls_by_rank(partials)
    for row in rows:
        row.update(_rank_spread(op_walls.get((row["op"], row["pg_name"]), {})))
    out = pd.DataFrame(rows)[list(WALL_COLUMNS)]
    for column in ("op_wall_min_rank", "op_wall_max_rank"):  # whole ranks, None: not 1.0
        out[column] = pd.Series([row[column] for row in rows], dtype=object)
    return out


def _op_walls_by_rank(partials: pd.DataFrame | None) -> dict[tuple[Any, Any], dict[Any, float]]:
    """Per (op, group): each rank's wall per step, every caller's summed (timed only)."""
    if partials is None or partials.empty:
        return {}
    timed = partials[partials["timed"].to_numpy(dtype=bool)]
    walls: dict[tuple[Any, Any], dict[Any, float]] = {}
    for (op, pg, rank), wall in timed.groupby(["op", "pg_name", "rank"], sort=True)["wall"]:
        walls.setdefault((op, pg), {})[rank] = float(wall.astype(float).sum())
    return walls


def _rank_spread(walls: dict[Any, float]) -> dict[str, Any]:
    """The lowest and the highest of the ranks' walls, each with its rank."""
    if not walls:
        return {
            "op_wall_ms_min": np.nan,
            "op_wall_min_rank": None,
            "op_wall_ms_max": np.nan,
            "op_wall_max_rank": None,
        }
    ordered = sorted(walls.items(), key=lambda item: (item[1], item[0]))
    low = ordered[0]
    high = min((kv for kv in ordered if kv[1] == ordered[-1][1]), key=lambda kv: kv[0])
    return {
        "op_wall_ms_min": float(low[1]),
        "op_wall_min_rank": int(low[0]),
        "op_wall_ms_max": float(high[1]),
        "op_wall_max_rank": int(high[0]),
    }


def ddp_buckets(table: pd.DataFrame) -> pd.DataFrame:
    """DDP gradient buckets: the all-reduces of each step in issue order, with their
    offset from the step's first bucket (rank, step, bucket, bytes, start_ms, dur_ms)."""
    cols = ["rank", "step", "bucket", "bytes", "start_ns", "end_ns", "start_ms", "dur_ms"]
    if table is None or len(table) == 0:
        return pd.DataFrame(columns=cols)
    mask = ((table["op"] == "all_reduce") & (table["step"] >= 0)).to_numpy()
    b = table.loc[mask, ["rank", "step", "bytes", "start_ns", "end_ns", "dur_ms"]]
    if b.empty:
        return pd.DataFrame(columns=cols)
    b = b.sort_values(["rank", "step", "start_ns"], ignore_index=True)
    b["bucket"] = b.groupby(["rank", "step"]).cumcount()
    first = b.groupby(["rank", "step"])["start_ns"].transform("min")
    b["start_ms"] = (b["start_ns"] - first) / 1e6
    return b[cols]


def transfer_ms(collectives: pd.DataFrame) -> pd.Series:
    """Each call's time from the last rank's arrival to its end on this rank (ms): the
    transfer, without the wait for late peers. The k-th call of a group is matched across
    ranks (``pg_name``, ``index``); a call not seen on every rank of its group keeps its
    whole duration."""
    c = collectives
    starts = pd.to_numeric(c["start_ns"], errors="coerce").astype(float)
    key = [c["pg_name"].astype(str), c["index"]]
    last = starts.groupby(key).transform("max")
    seen = c["rank"].groupby(key).transform("nunique")
    net = (pd.to_numeric(c["end_ns"], errors="coerce").astype(float) - last) / 1e6
    whole = pd.to_numeric(c["dur_ms"], errors="coerce").astype(float)
    complete = seen >= pd.to_numeric(c["pg_size"], errors="coerce").fillna(np.inf)
    return net.where(complete & (net >= 0), whole)


def allreduce_stall(traces: list[RankTrace], table: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: how long compute stands still after backward issued its last
    gradient bucket until every all-reduce of the step has completed (the training
    thread, or the GPU, waiting for the last buckets). ``stall_ms`` = the time in
    [issue of the step's last all-reduce, completion of its last all-reduce] not covered
    by compute."""
    cols = list(STALL_COLUMNS)
    if table is None or len(table) == 0:
        return pd.DataFrame(columns=cols)
    mask = (
        (table["op"] == "all_reduce") & (table["step"] >= 0) & table["end_ns"].notna()
    ).to_numpy()
    ar = table.loc[mask, ["rank", "step", "start_ns", "end_ns", "bytes"]]
    if ar.empty:
        return pd.DataFrame(columns=cols)
    g = ar.sort_values("start_ns").groupby(["rank", "step"])
    per = pd.DataFrame(
        {
            "issue_ns": g["start_ns"].max(),
            "done_ns": g["end_ns"].max(),
            "buckets": g.size(),
            "last_bucket_bytes": g["bytes"].last(),
        }
    ).reset_index()
    # per is in rank order (groupby): each rank's windows are one run of rows, and only
    # its compute intervals are unpacked, one rank at a time (no frame per rank)
    by_rank = {t.meta.rank: t for t in traces}
    rank = per["rank"].to_numpy()
    keep = np.array([int(r) in by_rank for r in rank], dtype=bool)
    if not keep.any():
        return pd.DataFrame(columns=cols)
    per = per[keep].reset_index(drop=True)
    rank = rank[keep]
    lo = per["issue_ns"].to_numpy(dtype=np.int64)
    hi = np.maximum(per["done_ns"].to_numpy(dtype=np.int64), lo)
    busy = np.zeros(len(per), dtype=np.int64)
    bounds = np.flatnonzero(np.diff(rank)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(per)], strict=True):
        compute = activity_sets(by_rank[int(rank[a])])["compute"]
        busy[a:b] = iv.per_window_length(compute, lo[a:b], hi[a:b])
    return per.assign(stall_ms=(hi - lo - busy) / 1e6)[cols]


def allreduce_stall_by_ranks(
    traces: list[RankTrace], pieces: Iterable[pd.DataFrame]
) -> pd.DataFrame:
    """:func:`allreduce_stall` of a collective table given in pieces of whole ranks, in
    rank order (collective_pieces'), one piece at a time: the same rows."""
    cols = list(STALL_COLUMNS)
    stalls = concat_pieces(allreduce_stall(traces, piece) for piece in pieces)
    return stalls if stalls is not None else pd.DataFrame(columns=cols)


def comm_per_step(traces: list[RankTrace]) -> pd.DataFrame:
    """Total communication time per rank and step (union of comm intervals inside the
    step window), the quantity torch-tb-profiler calls "Communication"."""
    from gpudiag.analysis.breakdown import step_windows

    rows = []
    for t in traces:
        w = step_windows(t)
        # tb-profiler counts comm kernels / gloo's transfers, not the training thread's
        # c10d:: calls (which the breakdown also counts as communication: waiting)
        ev = t.events
        sel = (ev["kind"] == "comm").to_numpy()
        comm = iv.union(ev["start_ns"].to_numpy()[sel], ev["end_ns"].to_numpy()[sel])
        ns = iv.per_window_length(comm, w["start_ns"].to_numpy(), w["end_ns"].to_numpy())
        rows.append(pd.DataFrame({"rank": t.meta.rank, "step": w["step"], "comm_ms": ns / 1e6}))
    if not rows:
        return pd.DataFrame(columns=["rank", "step", "comm_ms"])
    return pd.concat(rows, ignore_index=True)


PEER_WAIT_COLUMNS = ("rank", "steps", "comm_exposed_ms", "peer_wait_ms", "unmatched_ms")
# How far a matched call may seem to end before the last rank arrived (clock differences):
# on every complete recorded set here (gloo, the NCCL sets) the margin is >= 6 µs.
MATCH_TOLERANCE_NS = 100_000


_SPAN_COLUMNS = ("rank", "wait", "lo", "hi")


def _wait_spans(collectives: pd.DataFrame, world_size: int | None) -> pd.DataFrame:
    """Per collective call: (rank, wait, lo, hi). ``wait`` rows span the call's wait for
    the last peer to arrive ([its arrival, the last rank's arrival], no later than its
    end); ``unmatched`` rows span a whole call that was not seen on every rank of its
    group with the same op, or whose calls do not overlap in time (not one collective):
    its wait for peers is unknown. In the table's order."""
    spans = concat_pieces(_wait_span_pieces(collectives, world_size))
    if spans is None:  # no call with a span
        return _no_spans()
    order = np.argsort(spans["at"].to_numpy(), kind="stable")
    return pd.DataFrame({name: spans[name].to_numpy()[order] for name in _SPAN_COLUMNS})


def _no_spans() -> pd.DataFrame:
    empty = {"rank": np.int64, "wait": bool, "lo": np.int64, "hi": np.int64}
    return pd.DataFrame({name: np.empty(0, dtype) for name, dtype in empty.items()})


def _wait_span_pieces(
    collectives: Table, world_size: int | None, spill: SpillFile | None = None
) -> Iterator[pd.DataFrame]:
    """:func:`_wait_spans` a few whole matched groups at a time (matching.match_groups,
    through ``spill`` where the table is on disk), each row with its position (``at``)
    among the calls with a start."""
    for piece in match_groups(collectives, WAIT_READS, spill, prepare=_with_start):
        spans = _group_wait_spans(piece, world_size)
        if len(spans):
            yield spans


def _with_start(calls: pd.DataFrame) -> pd.DataFrame:
    """The calls with a start, their start and end as numbers."""
    start = pd.to_numeric(calls["start_ns"], errors="coerce")
    end = pd.to_numeric(calls["end_ns"], errors="coerce")
    retyped = start.dtype != calls["start_ns"].dtype or end.dtype != calls["end_ns"].dtype
    if retyped or start.isna().any():
        read = [c for c in WAIT_READS if c in calls]
        calls = calls[read].assign(start_ns=start, end_ns=end).dropna(subset=["start_ns"])
    return calls


def _group_wait_spans(c: pd.DataFrame, world_size: int | None) -> pd.DataFrame:
    """_wait_spans of whole match groups (matching.match_groups' pieces), with
    each row's position in the table (``at``)."""
    c = c.drop_duplicates(["pg_name", "key", "rank"])
    group = c.groupby(["pg_name", "key"], sort=False)
    expected = pd.to_numeric(c["pg_size"], errors="coerce")
    if world_size:  # the default group spans the world
        expected = expected.where(expected.notna() | (c["pg_name"] != "0"), float(world_size))
    last = group["start_ns"].transform("max").to_numpy(dtype=float)
    # one collective: no rank's call ends before the last rank arrives (a tolerance for
    # clocks of different GPUs or nodes); else the k-th calls are not the same collective
    first_end = group["end_ns"].transform("min").to_numpy(dtype=float)
    overlapping = ~(first_end < last - MATCH_TOLERANCE_NS)
    matched = (
        (group["rank"].transform("nunique") >= expected.fillna(np.inf))
        & (group["op"].transform(lambda ops: ops.astype(str).nunique()) == 1)
    ).to_numpy() & overlapping
    start = c["start_ns"].to_numpy(dtype=float)
    end = c["end_ns"].to_numpy(dtype=float)
    wait_end = np.where(np.isnan(end), last, np.minimum(last, end))
    hi = np.where(matched, wait_end, end)
    keep = ~np.isnan(hi) & (hi > start)
    return pd.DataFrame(
        {
            "at": c.index.to_numpy()[keep],
            "rank": c["rank"].to_numpy(dtype=np.int64)[keep],
            "wait": matched[keep],
            "lo": start[keep].astype(np.int64),
            "hi": hi[keep].astype(np.int64),
        }
    )


_Spans = tuple[np.ndarray, np.ndarray, np.ndarray]  # (wait, lo, hi) of _wait_spans' rows


def _spans_by_rank(spans: pd.DataFrame) -> tuple[dict[Any, _Spans], _Spans]:
    """Each rank's rows of ``spans`` as arrays, in the table's order (one pass: a filter
    per rank would make the wait for peers grow with ranks x ranks), and the arrays of a
    rank without rows."""
    wait = spans["wait"].to_numpy(dtype=bool)
    lo, hi = spans["lo"].to_numpy(), spans["hi"].to_numpy()
    rows_of = spans.groupby("rank", sort=False).indices if len(spans) else {}
    by_rank = {rank: (wait[rows], lo[rows], hi[rows]) for rank, rows in rows_of.items()}
    return by_rank, (wait[:0], lo[:0], hi[:0])


def peer_wait(
    traces: list[RankTrace],
    collectives: Table,
    world_size: int | None = None,
    spill: SpillFile | None = None,
) -> pd.DataFrame:
    """Per traced rank, over its analysed steps (the per-rank table's, means per step):
    ``comm_exposed_ms`` (the table's number), ``peer_wait_ms``: the part of it spent
    waiting for the last peer to arrive at a collective (arrival skew: this rank's
    arrival to the last rank's, each call matched across the ranks of its group as in
    stragglers.py), and ``unmatched_ms``: the part inside calls not matched on every rank
    of their group (only some ranks traced, different profiled windows), whose wait for
    peers is unknown. Overlapping calls (DDP buckets) count once. A table kept on disk
    is matched, and its spans read per rank, through ``spill`` (matching.py)."""
    spans = (
        SpilledTable.build(_wait_span_pieces(collectives, world_size, spill), spill)
        if collectives is not None and len(collectives)
        else None
    )
    traces_of: dict[Any, list[int]] = {}
    for i, trace in enumerate(traces):
        traces_of.setdefault(trace.meta.rank, []).append(i)
    found: dict[int, dict[str, Any] | None] = {}
    for block in rank_blocks(spans, _SPAN_COLUMNS, spill) if spans is not None else ():
        for rank, rank_spans in _spans_by_rank(block)[0].items():
            for i in traces_of.get(rank, ()):
                found[i] = _rank_peer_wait(traces[i], rank_spans)
    del spans
    no_spans = _spans_by_rank(_no_spans())[1]
    rows = [
        row
        for i, trace in enumerate(traces)
        if (row := found[i] if i in found else _rank_peer_wait(trace, no_spans)) is not None
    ]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in PEER_WAIT_COLUMNS})
    return pd.DataFrame(rows)[list(PEER_WAIT_COLUMNS)]


def _rank_peer_wait(trace: RankTrace, spans: _Spans) -> dict[str, Any] | None:
    """peer_wait's row of one rank, from its spans (None: no analysed step)."""
    from gpudiag.analysis.breakdown import component_intervals, step_window_bounds

    lo, hi = step_window_bounds(trace)
    if not len(lo):
        return None
    exposed = component_intervals(trace, ("comm_exposed",))["comm_exposed"]
    waiting, span_lo, span_hi = spans
    wait = iv.union(span_lo[waiting], span_hi[waiting])
    unknown = iv.subtract(iv.union(span_lo[~waiting], span_hi[~waiting]), wait)
    return {
        "rank": trace.meta.rank,
        "steps": len(lo),
        "comm_exposed_ms": float(iv.per_window_length(exposed, lo, hi).mean()) / 1e6,
        "peer_wait_ms": float(iv.per_window_length(iv.intersect(exposed, wait), lo, hi).mean())
        / 1e6,
        "unmatched_ms": float(iv.per_window_length(iv.intersect(exposed, unknown), lo, hi).mean())
        / 1e6,
    }
