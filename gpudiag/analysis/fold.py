"""Fold each rank's result into the cross-rank inputs as it arrives.

The per-rank task (ingest.load_task, in a local pool process or on a Dask worker) sends
back one rank's results, cached on its trace. :class:`RankFold` takes each result as it
arrives on the client (``ingest.load_traces(on_arrival=...)``; the local pool and the
Dask path both call it) and keeps only what the cross-rank analyses read, in a form
whose cost does not grow with anything but the rows themselves:

* the per-rank tables read across ranks (``step_breakdown``: the step breakdown;
  ``collective_rows``: the rank's collectives, matched across ranks for stragglers,
  desync and the all-reduce stall; ``step_windows``: the profiled steps' windows, for the
  wait for peers), and the trace's own step table (``RankTrace.step_rows``, read as
  ``steps``) move into one :class:`TableStore` per table: numpy
  columns per column layout, shared by every rank, strings interned. The trace keeps a
  2-slot handle (:class:`StoredRows`), so every per-rank reader still works, and
  :func:`rank_rows` gives the cross-rank stage all ranks' rows at once, without a
  DataFrame per rank;
* the trace's metadata shares equal device lists and process-group configs across ranks
  (every rank of a job lists the same ones; a real job's pg_config lists every rank of
  every group, so it would otherwise grow with ranks x ranks);
* the rank's packed activity sets (the all-reduce stall and the exposed communication's
  wait for peers, comms.peer_wait, read them against windows known only once every rank
  is in) and its packed, bounded timeline (timeline.RANK_BUDGET intervals at most, for
  the report's and dashboard's Timeline) go to the fold's spill file
  (:class:`~gpudiag.analysis.spill.SpillFile`, a temporary file; in memory where it
  cannot be written), read back when an analysis or a view reads them;
* then the rest of the trace's cache (a dozen small per-rank results: data-loader wait,
  host syncs, kernel busy, scalars, and the handles above) is pickled into the spill
  file too (:class:`SpilledCache`): its dict and objects were most of what stayed per
  rank. Each read unpickles it (the handles come back as references into the stores and
  the file, not copies); a result written on the client brings that rank's back.

What stays in memory per rank: the trace, its metadata, a handle to its step rows and
one to its pickled cache (docs/cluster.md gives the bytes).

Rank numbers are final only once every trace is in (ingest._assign_ranks): the stores
keep rows without the rank; :func:`rank_rows` adds it, in the traces' final order.
Folding changes no number: ``rank_rows`` equals ``pd.concat`` of the per-rank frames,
which tests/test_fold.py checks on the recorded traces.
"""

from __future__ import annotations

import io
import pickle
from array import array
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from gpudiag.analysis.spill import Blob, SpilledArray, SpilledBytes, SpillFile, as_bytes
from gpudiag.analysis.trace_model import FrameColumns, FramePart, RankTrace

# The per-rank tables the cross-rank stage reads from every rank (RankTrace.cache keys);
# step_windows: read rank by rank (comms.peer_wait), kept in a store for its size only.
FOLDED_TABLES = ("step_breakdown", "collective_rows", "step_windows")
# rank_rows' key for the trace's own step table (RankTrace.step_rows), folded too
STEPS = "steps"
# Cached results whose packed bytes go to the spill file: timeline.RankLanes,
# intervals.PackedSets (their ``blob``).
_SPILLED = ("timeline", "activity_sets")
# Consolidate a layout's column chunks after this many appended parts.
_CHUNK_PARTS = 64

Layout = tuple[tuple[Any, ...], tuple[Any, ...]]  # (column names, dtypes)


Chunk: TypeAlias = np.ndarray | SpilledArray  # a run of a column's rows, in memory or spilled


@dataclass
class _Columns:
    """The rows of every part of one column layout."""

    names: tuple[Any, ...]
    dtypes: tuple[Any, ...]
    # per column: blocks of _CHUNK_PARTS parts each, then the parts appended since; a
    # block may be kept in the spill file (read back a slice at a time)
    chunks: list[list[Chunk]] = field(default_factory=list)
    pending: int = 0  # parts at the end of each column's chunks not yet in a block
    rows: int = 0
    # columns whose one chunk is this store's own copy (fill may write into it)
    owned: set[int] = field(default_factory=set)
    # where each block goes as it is made (TableStore.spill_blocks), else None
    spill_to: SpillFile | None = None

    @property
    def spilled(self) -> bool:
        """Whether some rows are kept in the spill file."""
        return any(isinstance(c, SpilledArray) for chunks in self.chunks for c in chunks)

    def append(self, values: tuple[np.ndarray, ...]) -> int:
        if not self.chunks:
            self.chunks = [[] for _ in self.names]
        start = self.rows
        for chunks, v in zip(self.chunks, values, strict=True):
            chunks.append(v)
        self.rows += len(values[0]) if values else 0
        self.pending += 1
        if self.pending >= _CHUNK_PARTS:
            self._block_pending()
        return start

    def _block_pending(self) -> None:
        """The pending parts of each column as one block (spilled where the store's
        blocks go to the spill file). Not the whole column: copying every row again
        every _CHUNK_PARTS parts cost O(rows^2) and, while it copied, twice the column
        (the peak of loading a many-rank run)."""
        if self.pending > 1 or (self.pending and self.spill_to is not None):
            for i, chunks in enumerate(self.chunks):
                parts = chunks[-self.pending :]
                del chunks[-self.pending :]
                chunks.append(self._kept(i, parts))
        self.pending = 0

    def _kept(self, i: int, parts: list[Chunk]) -> Chunk:
        """One chunk of these in-memory parts: spilled where blocks go to the file."""
        arrays = [p for p in parts if isinstance(p, np.ndarray)]
        if self.spill_to is not None and len(arrays) == len(parts):
            try:
                self.owned.discard(i)
                return SpilledArray.keep_chunks(arrays, self.spill_to)
            except TypeError:  # an unhashable object: kept in memory
                pass
        return np.concatenate([_array(p) for p in parts])

    def rows_of(self, i: int, spans: Sequence[tuple[int, int]], view: bool = False) -> np.ndarray:
        """Column ``i``'s rows of each (first row, rows) span, joined: an array of its
        own (``view``: of one span within one chunk in memory, the store's own). Read
        from the chunks as they are: joining a column's chunks into one array first
        made a second copy of it (its old chunks freed in small pieces the C allocator
        keeps: the client's peak while a many-rank run's table is made)."""
        parts = list(self._slices(i, _joined_spans(spans)))
        if view and len(parts) == 1:
            return parts[0]
        if not parts:
            return np.empty(0, dtype=self.chunks[i][0].dtype)
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def _slices(self, i: int, spans: Sequence[tuple[int, int]]) -> Iterator[np.ndarray]:
        """Column ``i``'s rows covering each span, in order: views of the chunks in
        memory, reads of the spilled ones."""
        chunks = self.chunks[i]
        bounds = np.cumsum([0, *(len(c) for c in chunks)])
        for start, n in spans:
            at, end = start, start + n
            k = int(np.searchsorted(bounds, at, side="right")) - 1
            while at < end:
                first = int(bounds[k])
                take = min(end, int(bounds[k + 1])) - at
                chunk = chunks[k]
                if isinstance(chunk, SpilledArray):
                    yield chunk.read(at - first, take)
                else:
                    yield chunk[at - first : at - first + take]
                at += take
                k += 1

    def spill(self, file: SpillFile) -> None:
        """Every column that can be kept there (not one of unhashable objects) into
        ``file``, its chunks in memory written one after another (never joined)."""
        self._block_pending()
        for i, chunks in enumerate(self.chunks):
            arrays = [c for c in chunks if isinstance(c, np.ndarray)]
            if not arrays:
                continue
            try:
                self.chunks[i] = self._spilled_runs(chunks, file)
            except TypeError:
                continue
            self.owned.discard(i)

    @staticmethod
    def _spilled_runs(chunks: list[Chunk], file: SpillFile) -> list[Chunk]:
        """The chunks with each run of chunks in memory spilled as one."""
        out: list[Chunk] = []
        run: list[np.ndarray] = []
        for chunk in [*chunks, None]:
            if isinstance(chunk, np.ndarray):
                run.append(chunk)
                continue
            if run:
                out.append(SpilledArray.keep_chunks(run, file))
                run = []
            if chunk is not None:
                out.append(chunk)
        return out

    def _unspill(self) -> None:
        for i, chunks in enumerate(self.chunks):
            if any(isinstance(c, SpilledArray) for c in chunks):
                self.chunks[i] = [np.concatenate([_array(c) for c in chunks])]
                self.owned.add(i)

    def fill(self, i: int, start: int, rows: int, value: object) -> None:
        self._unspill()
        if len(self.chunks[i]) != 1 or i not in self.owned:
            self._block_pending()
            self.chunks[i] = [np.concatenate([_array(c) for c in self.chunks[i]])]
            self.owned.add(i)
        self.chunks[i][0][start : start + rows] = value  # type: ignore[index]


def _array(chunk: Chunk) -> np.ndarray:
    return chunk.read() if isinstance(chunk, SpilledArray) else chunk


class TableStore:
    """One per-rank table of every rank, appended part by part as results arrive: numpy
    columns per column layout (names and dtypes), object values interned."""

    def __init__(self) -> None:
        self._layouts: dict[Layout, _Columns] = {}
        # per part (a rank's table): its layout, first row and rows; arrays, not a tuple
        # per part (~100 bytes each, 5 tables per rank)
        self._part_layouts: list[_Columns] = []
        self._part_starts = array("q")
        self._part_rows = array("q")
        self._strings: dict[str, str] = {}
        self._spill_to: SpillFile | None = None

    def add(self, part: FrameColumns) -> StoredRows | None:
        """Store one rank's table (None when it cannot be: a non-default index)."""
        if part.index is not None or len({str(n) for n in part.names}) != len(part.names):
            return None
        key = (part.names, part.dtypes)
        cols = self._layouts.get(key)
        if cols is None:
            cols = _Columns(part.names, part.dtypes, spill_to=self._spill_to)
            self._layouts[key] = cols
        values = tuple(self._intern(v) for v in part.values)
        start = cols.append(values)
        self._part_layouts.append(cols)
        self._part_starts.append(start)
        self._part_rows.append(len(values[0]) if values else 0)
        return StoredRows(self, len(self._part_layouts) - 1)

    def _part(self, part: int) -> tuple[_Columns, int, int]:
        """(layout, first row, rows) of one part."""
        return self._part_layouts[part], self._part_starts[part], self._part_rows[part]

    def _intern(self, values: np.ndarray) -> np.ndarray:
        if values.dtype != object:
            return values
        out = values.copy()
        for i, v in enumerate(out):
            if type(v) is str:
                out[i] = self._strings.setdefault(v, v)
        return out

    def rows(self, part: int) -> int:
        return self._part_rows[part]

    def fill(self, part: int, column: str, value: object) -> bool:
        """Set ``column`` to ``value`` in every row of this part, in place, as
        ``frame[column] = value`` would (False where that would change the column's
        dtype: the caller rebuilds the part instead)."""
        cols, start, rows = self._part(part)
        if column not in cols.names:
            return False
        i = cols.names.index(column)
        try:
            same = np.dtype(cols.dtypes[i]) == np.asarray(value).dtype
        except TypeError:  # an extension dtype
            same = False
        if not same:
            return False
        cols.fill(i, start, rows, value)
        return True

    def numbers(self, part: int, names: Sequence[str]) -> list[np.ndarray] | None:
        """These numeric columns of one part, as the arrays kept (None when one is not a
        plain numpy number column: read the frame instead)."""
        cols, start, rows = self._part(part)
        at = [cols.names.index(n) if n in cols.names else -1 for n in names]
        if any(i < 0 or not _plain_number(cols.dtypes[i]) for i in at):
            return None
        return [cols.rows_of(i, [(start, rows)], view=True) for i in at]

    def frame(self, parts: list[int]) -> pd.DataFrame:
        """``pd.concat([part frames], ignore_index=True)`` of these parts, in this order."""
        layouts = {id(self._part_layouts[p]) for p in parts}
        if len(layouts) != 1:  # several layouts: let pandas reconcile the dtypes
            return pd.concat([self.frame([p]) for p in parts], ignore_index=True)
        cols = self._part_layouts[parts[0]]
        spans = [(start, n) for _, start, n in map(self._part, parts)]
        columns = {
            name: pd.Series(cols.rows_of(i, spans), dtype=dtype, copy=False)
            for i, (name, dtype) in enumerate(zip(cols.names, cols.dtypes, strict=True))
        }
        return pd.DataFrame(columns, columns=list(cols.names))

    def spill(self, file: SpillFile) -> None:
        """Every row into ``file``, read back a slice at a time when read (the table
        was read across ranks once; only a rank's own reader, rarely, reads it again)."""
        for cols in self._layouts.values():
            cols.spill(file)

    def spill_blocks(self, file: SpillFile) -> None:
        """From now on, each block of _CHUNK_PARTS parts goes to ``file`` as it is
        made: the rows of a many-rank run never sit in memory together."""
        self._spill_to = file
        for cols in self._layouts.values():
            cols.spill_to = file


class StoredRows(FramePart):
    """A rank's table kept in a :class:`TableStore` (what its trace's cache holds)."""

    __slots__ = ("part", "store")

    def __init__(self, store: TableStore, part: int) -> None:
        self.store = store
        self.part = part

    def frame(self) -> pd.DataFrame:
        return self.store.frame([self.part])

    def columns(self, names: Sequence[str]) -> list[np.ndarray]:
        kept = self.store.numbers(self.part, names)
        return kept if kept is not None else super().columns(names)

    def with_constant(self, column: str, value: object) -> FramePart:
        if self.store.fill(self.part, column, value):
            return self
        return super().with_constant(column, value)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled alone: as plain columns
        return (_as_columns, (self.frame(),))


def _joined_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(first row, rows) spans with each one that starts where the last ended joined
    to it (a run of consecutive ranks' parts: one read)."""
    joined: list[tuple[int, int]] = []
    for start, n in spans:
        if joined and joined[-1][0] + joined[-1][1] == start:
            joined[-1] = (joined[-1][0], joined[-1][1] + n)
        else:
            joined.append((start, n))
    return joined


def _plain_number(dtype: Any) -> bool:
    return isinstance(dtype, np.dtype) and dtype.kind in "iufb"


def _as_columns(frame: pd.DataFrame) -> FrameColumns:
    return FrameColumns.of(frame)


def _store(store: TableStore, value: object) -> StoredRows | None:
    """``value`` (a small frame, or one as columns) kept in ``store``; None where it
    cannot be kept exactly."""
    if isinstance(value, pd.DataFrame) and not isinstance(value.columns, pd.MultiIndex):
        compact = FrameColumns.of(value)
        value = compact if compact.round_trips(value) else None
    if isinstance(value, FrameColumns):
        return store.add(value)
    return None


def _held(trace: RankTrace, key: str) -> object:
    return trace.step_rows if key == STEPS else trace.cache.get(key)


class RankFold:
    """The cross-rank inputs, folded from each rank's result as it arrives."""

    def __init__(self) -> None:
        self.tables: dict[str, TableStore] = {key: TableStore() for key in FOLDED_TABLES}
        self.steps = TableStore()
        self.spill = SpillFile()
        # every call of every rank: its blocks go to disk as they are made (docs/cluster.md)
        self.tables["collective_rows"].spill_blocks(self.spill)
        self._shared: dict[str, Any] = {}

    def add(self, trace: RankTrace) -> None:
        """Fold one arriving result (the trace keeps handles to what moved)."""
        for key, store in self.tables.items():
            stored = _store(store, trace.cache.get(key))
            if stored is not None:
                trace.cache[key] = stored
        stored = _store(self.steps, trace.step_rows)
        if stored is not None:
            trace.step_rows = stored
        self._share_meta(trace)
        self._spill(trace)
        self._spill_cache(trace)

    def _spill(self, trace: RankTrace) -> None:
        for key in _SPILLED:
            value = trace.cache.get(key)
            blob = getattr(value, "blob", None)
            if isinstance(blob, bytes):
                value.blob = self.spill.keep(blob)  # type: ignore[union-attr]

    def _spill_cache(self, trace: RankTrace) -> None:
        """The rest of the trace's cache (a dozen small results and the handles above:
        its dict and their objects were most of what stayed per rank) pickled into the
        spill file; the stores and spilled bytes it refers to are pickled as references."""
        if isinstance(trace.cache, SpilledCache):
            return
        trace.time_range  # noqa: B018 - cached first: load_traces reads it of every rank
        buffer = io.BytesIO()
        _FoldPickler(self, buffer).dump(dict(trace.cache))
        trace.cache = SpilledCache(self, self.spill.keep(buffer.getvalue()))

    def spill_rows(self, key: str) -> None:
        """The rows of one folded table into the spill file, once the cross-rank stage
        has read them (the collective rows: into the collective table)."""
        self.store_named(key).spill(self.spill)

    def store_named(self, key: str) -> TableStore:
        return self.steps if key == STEPS else self.tables[key]

    def store_key(self, store: TableStore) -> str | None:
        if store is self.steps:
            return STEPS
        return next((k for k, s in self.tables.items() if s is store), None)

    def unpickle(self, data: bytes) -> dict[str, Any]:
        values: dict[str, Any] = _FoldUnpickler(self, io.BytesIO(data)).load()
        return values

    def _share_meta(self, trace: RankTrace) -> None:
        meta = trace.meta
        meta.device_properties = self._share(meta.device_properties)
        meta.pg_config = self._share(meta.pg_config)
        meta.backend = self._share(meta.backend)

    def _share(self, value: Any) -> Any:
        if not value:
            return value
        return self._shared.setdefault(repr(value), value)


class _FoldPickler(pickle.Pickler):
    """Pickles a folded cache; what lives in the fold (the rows in its stores, the bytes
    in its spill file) as references to it, not copies."""

    def __init__(self, fold: RankFold, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fold = fold

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is StoredRows:
            key = self.fold.store_key(obj.store)
            return None if key is None else ("rows", key, obj.part)
        if type(obj) is SpilledBytes and obj.file is self.fold.spill:
            return ("bytes", obj.offset, obj.length)
        return None


class _FoldUnpickler(pickle.Unpickler):
    def __init__(self, fold: RankFold, file: io.BytesIO) -> None:
        super().__init__(file)
        self.fold = fold

    def persistent_load(self, pid: Any) -> Any:
        kind, a, b = pid
        if kind == "rows":
            return StoredRows(self.fold.store_named(a), b)
        if kind == "bytes":
            return SpilledBytes(self.fold.spill, a, b)
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")


class SpilledCache(MutableMapping[str, Any]):
    """A folded trace's ``RankTrace.cache``, pickled in the fold's spill file (or, where
    that cannot be written, kept pickled in memory): each read unpickles it. A write
    (a result computed on the client) brings it back into memory for good, as a dict."""

    __slots__ = ("_blob", "_fold", "_values")

    def __init__(self, fold: RankFold, blob: Blob) -> None:
        self._fold = fold
        self._blob: Blob | None = blob
        self._values: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        if self._values is not None:
            return self._values
        assert self._blob is not None
        return self._fold.unpickle(as_bytes(self._blob))

    def _own(self) -> dict[str, Any]:
        if self._values is None:
            self._values = self._read()
            self._blob = None
        return self._values

    def __getitem__(self, key: str) -> Any:
        return self._read()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __setitem__(self, key: str, value: Any) -> None:
        self._own()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._own()[key]

    @property
    def spilled(self) -> bool:
        """Whether the values are (still) kept pickled rather than as objects."""
        return self._values is None

    def __reduce__(self) -> tuple[Any, ...]:  # pickled alone (a dashboard's cache): a dict
        return (dict, (self._read(),))


def rank_rows(
    traces: list[RankTrace],
    key: str,
    per_rank: Callable[[RankTrace], pd.DataFrame],
    on_error: Callable[[RankTrace, Exception], None] | None = None,
) -> list[pd.DataFrame]:
    """Every rank's non-empty ``per_rank(trace)`` frame (with its ``rank`` column), in
    the traces' order, for one ``pd.concat`` (``key``: a cache key of FOLDED_TABLES, or
    STEPS): ranks whose table is in a store come out as one frame per run of
    consecutive ranks instead of one each. ``on_error``: called for a rank whose table
    failed (else the error is raised)."""
    return list(iter_rank_rows(traces, key, per_rank, on_error))


def iter_rank_rows(
    traces: list[RankTrace],
    key: str,
    per_rank: Callable[[RankTrace], pd.DataFrame],
    on_error: Callable[[RankTrace, Exception], None] | None = None,
    max_rows: int | None = None,
) -> Iterator[pd.DataFrame]:
    """:func:`rank_rows`, each frame made as it is taken; with ``max_rows``, a run of
    stored ranks is cut once it holds that many rows (whole ranks: a little more)."""
    run: list[tuple[StoredRows, int]] = []
    rows = 0

    for trace in traces:
        value = _held(trace, key)
        if isinstance(value, StoredRows) and (not run or value.store is run[0][0].store):
            if value.store.rows(value.part):
                run.append((value, int(trace.meta.rank)))
                rows += value.store.rows(value.part)
            if max_rows is not None and rows >= max_rows:
                yield _with_ranks(run)
                run, rows = [], 0
            continue
        if run:
            yield _with_ranks(run)
            run, rows = [], 0
        try:
            frame = per_rank(trace)
        except Exception as exc:
            if on_error is None:
                raise
            on_error(trace, exc)
            continue
        if frame is not None and len(frame):
            yield frame
    if run:
        yield _with_ranks(run)


def _with_ranks(run: list[tuple[StoredRows, int]]) -> pd.DataFrame:
    store = run[0][0].store
    parts = [stored.part for stored, _ in run]
    frame = store.frame(parts)
    ranks = np.repeat(
        np.array([rank for _, rank in run], dtype=np.int64), [store.rows(p) for p in parts]
    )
    if "rank" in frame.columns:
        frame["rank"] = ranks
    else:
        frame.insert(0, "rank", ranks)
    return frame
