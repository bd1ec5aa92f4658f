"""One rank's trace as the analyses read it: the event table's column contract,
:class:`RankTrace` and its metadata, the collectives' side table (``RankTrace.comm``)
and the compact forms a per-rank result travels in (:class:`FrameColumns`).

Built by :mod:`gpudiag.analysis.trace_table` from what :mod:`gpudiag.analysis.trace_parse`
collects; loaded through :mod:`gpudiag.analysis.ingest`.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

T = TypeVar("T")

EVENT_COLUMNS = (
    "name",
    "cat",
    "kind",
    "start_ns",
    "end_ns",
    "dur_ns",
    "pid",
    "tid",
    "thread_name",
    "stream",
    "is_gpu",
    "main_thread",
    "correlation",
    "external_id",
    "step",
)
# The collectives' fields: in ``RankTrace.comm``, one row per comm event (a few % of the
# events), indexed by the event's row label; :func:`with_comm` joins them to events.
COMM_COLUMNS = ("comm_op", "comm_bytes", "comm_dtype", "pg_name", "pg_size", "seq")
STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns")


class TraceError(ValueError):
    """One trace file that cannot be used; the message names the problem."""


@dataclass(slots=True)
class TraceMeta:
    rank: int
    world_size: int | None
    backend: str | None
    path: Path
    base_time_ns: int  # 0 when timestamps are absolute epoch µs already
    device_properties: list[dict] = field(default_factory=list)
    pg_config: list[dict] = field(default_factory=list)
    rank_source: str = "distributedInfo"  # | "file name" | "order"


@dataclass(slots=True)
class RankTrace:
    meta: TraceMeta
    events: pd.DataFrame
    # the profiled steps (STEP_COLUMNS), read as ``steps``; on the client a FramePart once
    # folded (fold.RankFold: a DataFrame per rank costs ~4 kB of Python objects)
    step_rows: pd.DataFrame | FramePart
    # the comm events' fields (COMM_COLUMNS), indexed by their row label in ``events``
    comm: pd.DataFrame = field(default_factory=lambda: no_comm())
    # derived values that several analyses share (e.g. breakdown's activity sets); on the
    # client a fold.SpilledCache once folded (kept pickled, not as objects)
    cache: MutableMapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def steps(self) -> pd.DataFrame:
        """The profiled steps (STEP_COLUMNS); a folded table comes back as a new frame,
        so change it by assigning ``steps``, not in place."""
        rows = self.step_rows
        return rows.frame() if isinstance(rows, FramePart) else rows

    @steps.setter
    def steps(self, frame: pd.DataFrame) -> None:
        self.step_rows = frame

    def set_step_rank(self) -> None:
        """The steps' ``rank`` column := the trace's (final) rank."""
        rows = self.step_rows
        if isinstance(rows, FramePart):
            self.step_rows = rows.with_constant("rank", self.meta.rank)
        else:
            rows["rank"] = self.meta.rank

    def cached(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per trace; kept in ``cache`` (which travels with the trace
        from an ingest worker, so per-rank analyses can run there in parallel). A failure
        is kept too and raised again on every later call, so an analysis that failed on
        a worker reports the same error where the events are no longer at hand."""
        value = self.cache.get(key, _MISSING)  # one read: a folded cache unpickles on each
        if value is _MISSING:
            try:
                value = self.cache[key] = compute()
            except Exception as exc:
                self.cache[key] = _Failed(_portable(exc))
                raise
        if isinstance(value, _Failed):
            raise value.exc
        if isinstance(value, FramePart):
            return value.frame()
        return value

    @property
    def time_range(self) -> tuple[int, int]:
        return self.cached("time_range", self._time_range)

    def _time_range(self) -> tuple[int, int]:
        if self.events.empty:
            return (0, 0)
        return int(self.events["start_ns"].min()), int(self.events["end_ns"].max())

    @property
    def events_dropped(self) -> bool:
        """True once :func:`drop_events` has run: only the cached per-rank results are left."""
        return bool(self.cache.get("events_dropped"))


class FramePart:
    """A small DataFrame kept in another form in ``RankTrace.cache``; ``cached`` gives
    back :meth:`frame` (FrameColumns; fold.StoredRows)."""

    __slots__ = ()

    def frame(self) -> pd.DataFrame:
        raise NotImplementedError

    def columns(self, names: Sequence[str]) -> list[np.ndarray]:
        """These columns' values, as ``frame()[name].to_numpy()`` would give them."""
        frame = self.frame()
        return [frame[name].to_numpy() for name in names]

    def with_constant(self, column: str, value: object) -> FramePart:
        """These rows with ``column`` set to ``value`` in every row (an existing column,
        same dtype)."""
        frame = self.frame()
        frame[column] = value
        return FrameColumns.of(frame)


@dataclass(frozen=True)
class FrameColumns(FramePart):
    """A small DataFrame kept as plain columns: what a per-rank result holds once its
    events are dropped (a DataFrame of a few rows costs 5-15 kB, its columns a tenth).
    :meth:`frame` gives back an equal DataFrame (same dtypes, same index)."""

    names: tuple[Any, ...]
    dtypes: tuple[Any, ...]
    values: tuple[np.ndarray, ...]
    index: np.ndarray | None  # None: a RangeIndex from 0

    @classmethod
    def of(cls, frame: pd.DataFrame) -> FrameColumns:
        plain = isinstance(frame.index, pd.RangeIndex) and frame.index.equals(
            pd.RangeIndex(len(frame))
        )
        return cls(
            tuple(frame.columns),
            tuple(frame.dtypes),
            tuple(frame[c].to_numpy() for c in frame.columns),
            None if plain else frame.index.to_numpy(),
        )

    def frame(self) -> pd.DataFrame:
        columns = {
            n: pd.Series(v, dtype=d, copy=True)
            for n, d, v in zip(self.names, self.dtypes, self.values, strict=True)
        }
        out = pd.DataFrame(columns, columns=list(self.names))
        if self.index is not None:
            out.index = self.index
        return out

    def round_trips(self, frame: pd.DataFrame) -> bool:
        try:
            pd.testing.assert_frame_equal(self.frame(), frame, check_exact=True)
        except (AssertionError, TypeError, ValueError):
            return False
        return True


_MISSING = object()


@dataclass(frozen=True)
class _Failed:
    """A per-rank analysis that raised (kept in ``RankTrace.cache``)."""

    exc: Exception


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (it travels back from a worker with the trace),
    else a RuntimeError that says the same."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception type can refuse
        return RuntimeError(f"{type(exc).__name__}: {_first_line(exc)}")


def drop_events(trace: RankTrace) -> None:
    """Keep only the per-rank results (``cache``), the steps and the metadata: what a
    remote worker sends back (a few kB to a few hundred kB instead of the event table)."""
    trace.time_range  # noqa: B018 - cached before the events go
    empty = trace.events.iloc[0:0].copy()
    for col in empty.columns:  # no category lists either (every kernel name...)
        if isinstance(empty[col].dtype, pd.CategoricalDtype):
            empty[col] = empty[col].cat.remove_unused_categories()
    trace.events = empty
    trace.comm = trace.comm.iloc[0:0]
    for key, value in trace.cache.items():  # small frames as plain columns
        if isinstance(value, pd.DataFrame) and not isinstance(value.columns, pd.MultiIndex):
            compact = FrameColumns.of(value)
            if compact.round_trips(value):
                trace.cache[key] = compact
    trace.cache["events_dropped"] = True


# One empty event table per column layout, shared by every trace that came back without
# its events (an empty DataFrame still costs ~20 kB; per rank, on the client).
_EMPTY_EVENTS: dict[tuple[tuple[str, str], ...], pd.DataFrame] = {}


def share_empty_events(trace: RankTrace) -> None:
    """After :func:`drop_events` (on the client, as a result arrives): use the shared
    empty event table of this layout instead of the trace's own copy."""
    if not trace.events_dropped or len(trace.events):
        return
    layout = tuple((str(c), str(d)) for c, d in trace.events.dtypes.items())
    trace.events = _EMPTY_EVENTS.setdefault(layout, trace.events)
    if not len(trace.comm):
        layout = tuple((str(c), str(d)) for c, d in trace.comm.dtypes.items())
        trace.comm = _EMPTY_EVENTS.setdefault(layout, trace.comm)


def no_comm() -> pd.DataFrame:
    """An empty ``RankTrace.comm`` (a trace without collectives)."""
    return _comm_table(np.empty(0, dtype=np.int64), _empty_fields(0))


def with_comm(rows: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (a selection of one trace's ``events``, e.g. ``events[mask]``) with the
    collectives' fields (COMM_COLUMNS) from that trace's ``comm`` as columns: each row's
    values, None (text) or NaN (numbers) on rows that are no collective."""
    fields = comm.reindex(rows.index)
    out = rows.copy()
    for name in COMM_COLUMNS:
        column = fields[name]
        if column.dtype == object:  # reindex fills NaN; a non-comm row's text is None
            values = column.to_numpy(copy=True)
            values[pd.isna(values)] = None
            column = pd.Series(values, index=rows.index, dtype=object, copy=False)
        out[name] = column
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:160] if text else type(exc).__name__


_COMM_FIELDS = ("comm_op", "comm_bytes", "comm_dtype", "pg_name", "pg_size", "seq", "comm_nelems")
_DTYPE_GUESS = "_dtype_guess"  # the kernel name's dtype, the last resort


def _comm_table(rows: np.ndarray, fields: dict[str, np.ndarray]) -> pd.DataFrame:
    """``RankTrace.comm`` from the fields over ``rows`` (event row labels). Each column's
    dtype is the one pandas infers for the values (text as ``str``, or object where all
    are None), as it would for a full-length column that is None off the comm rows;
    comm_nelems only served the bytes."""
    index = pd.Index(rows, dtype=np.int64)
    columns = {}
    for name in COMM_COLUMNS:
        kind_of: Any = object if name == "pg_name" else None  # group names may be ints
        columns[name] = pd.Series(fields[name], index=index, dtype=kind_of, copy=False)
    return pd.DataFrame(columns, index=index)


_OBJECT_FIELDS = frozenset({"comm_op", "comm_dtype", "pg_name", _DTYPE_GUESS})


def _empty_fields(
    n: int, names: Sequence[str] = (*_COMM_FIELDS, _DTYPE_GUESS)
) -> dict[str, np.ndarray]:
    return {
        name: np.full(n, None, dtype=object) if name in _OBJECT_FIELDS else np.full(n, np.nan)
        for name in names
    }


def outermost_calls(ops: pd.DataFrame) -> pd.DataFrame:
    """Drop ops nested inside an earlier op of the same thread (one row per call: a
    `.item()` is aten::item around aten::_local_scalar_dense around a stream sync)."""
    if len(ops) < 2:
        return ops
    ops = ops.sort_values("start_ns")
    reach = ops.groupby(["pid", "tid"], observed=True)["end_ns"].transform(
        lambda e: e.cummax().shift(fill_value=np.iinfo(np.int64).min)
    )
    return ops[(ops["start_ns"] >= reach).to_numpy()]
