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
import gzip
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import orjson
import pandas as pd

from gpudiag import rundir
from gpudiag.analysis import classify as cls
from gpudiag.rundir import (  # noqa: F401 - find_traces & co. re-exported
    BadInput,
    find_traces,
    is_trace_name,
    release_free_memory,
    trace_name_stem,
)

# A trace above this (uncompressed) is refused rather than loaded: parsing JSON costs
# several times its size in memory. Override with GPUDIAG_MAX_TRACE_BYTES.
DEFAULT_MAX_TRACE_BYTES = 1 << 30
# Two traces whose time ranges are this far apart come from different runs.
SEPARATE_RUN_GAP_NS = 600 * 1_000_000_000

_MAX_ABS_TS_US = 4e15  # keeps base + ts*1000 inside int64 (year ~2096 as epoch µs)
_MAX_DUR_US = 1e12  # 11.6 days

_RANK_IN_NAME_RES = (
    re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"worker[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[-_.])(\d+)$"),
)
_TB_HANDLER_RE = re.compile(r"^(.*)\.(\d{10,})$")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

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


class _NotUnicode(TraceError):
    """JSON text that orjson refuses for its Unicode alone (a lone surrogate escape,
    bytes that are not UTF-8): read again with those replaced (:func:`repair_unicode`)."""


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


# --------------------------------------------------------------------------- finding files


# A bare trailing number (``name_7``) is a rank only below this (and below the trace's
# world size when it has one): ``trace__1016001.json.gz`` ends with a job or process id.
MAX_BARE_RANK = 65536


def rank_from_name(path: Path, world_size: int | None = None) -> int | None:
    stem = trace_name_stem(path.name)
    patterns: tuple[re.Pattern[str], ...] = _RANK_IN_NAME_RES
    handler = _TB_HANDLER_RE.match(stem)
    if handler:  # tensorboard_trace_handler: <worker>.<ns>, worker = host_pid by default
        stem, patterns = handler.group(1), _RANK_IN_NAME_RES[:2]
    for pattern in patterns:
        m = pattern.search(stem)
        if m:
            rank = int(m.group(1))
            if pattern is _RANK_IN_NAME_RES[2] and not _plausible_rank(rank, world_size):
                return None
            return rank
    return None


def _plausible_rank(rank: int, world_size: int | None) -> bool:
    return rank < (world_size if world_size else MAX_BARE_RANK)


# --------------------------------------------------------------------------- reading one file


def max_trace_bytes() -> int:
    raw = os.environ.get("GPUDIAG_MAX_TRACE_BYTES")
    try:
        return int(raw) if raw else DEFAULT_MAX_TRACE_BYTES
    except ValueError:
        return DEFAULT_MAX_TRACE_BYTES


def read_trace_bytes(path: Path, limit: int, notes: list[str] | None = None) -> bytes:
    """The file's (decompressed) bytes, never more than ``limit``: bigger is refused, and
    so is anything but a regular file (rundir.open_regular), text that cannot begin a
    JSON trace and a NUL byte (_Source). Data after the gzip stream is a note in
    ``notes``."""
    try:
        src = _Source(path, limit, notes)
        try:
            parts = []
            while chunk := src.read():
                parts.append(chunk)
        finally:
            src.close()
        if not parts:
            raise TraceError("empty after decompression")
        data = b"".join(parts)
        del parts
        return data
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise _read_error(exc) from None


def _too_big(size: int, limit: int) -> str:
    return (
        f"trace is {size / 2**20:.0f} MiB uncompressed, above the {limit / 2**20:.0f} MiB "
        "limit; refused to bound memory (raise GPUDIAG_MAX_TRACE_BYTES or profile fewer steps)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:160] if text else type(exc).__name__


def parse_trace(data: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _read_error(exc) from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError("not a profiler trace (no 'traceEvents' list)")
    return doc


def _int_or_none(value: Any) -> int | None:
    """An int64 from an int, a finite float or a numeric string; None otherwise."""
    if isinstance(value, bool):
        return None
    finite = isinstance(value, float) and math.isfinite(value)
    numeric = isinstance(value, str) and value.strip().lstrip("-").isdigit()
    if not (isinstance(value, int) or finite or numeric):
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


class _Collector:
    """Keeps the complete ('X') events' fields and the thread names, chunk by chunk, as
    compact columns: numpy arrays and codes into interned strings (a parsed JSON event
    costs ~10x its text; these columns ~60 bytes per event)."""

    def __init__(self) -> None:
        self.n = 0
        self.skipped = 0
        self.interned: dict[str, dict[Any, int]] = {k: {} for k in ("name", "cat", "pid", "tid")}
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in _COLLECTED}
        # the comm fields (_comm_row) of the rows whose args may matter, as arrays per chunk
        self.comm_parts: dict[str, list[np.ndarray]] = {k: [] for k in _COMM_STORED}
        self.comm_strings: dict[str, str] = {}  # one object per distinct op/dtype/group
        self.thread_names: dict[tuple[str, str], str] = {}
        self.keeps_comm_args: dict[tuple[str, str], bool] = {}  # per distinct (name, cat)

    def add(self, events: list) -> None:
        cols = _collect_chunk(events, self)
        for key in ("name", "cat", "pid", "tid"):
            self.parts[key].append(_intern(cols[key], self.interned[key]))
        for key in ("ts", "dur"):
            self.parts[key].append(np.asarray(cols[key], dtype=np.float64))
        for key in ("stream", "correlation", "external_id"):
            self.parts[key].append(_id_column(cols[key]))
        self._add_comm(cols["comm_rows"], cols["comm_values"])
        self.n += len(cols["name"])

    def _add_comm(self, rows: list[int], values: list[tuple]) -> None:
        """The chunk's comm fields as arrays: no Python object per row outlives the chunk
        (a kept args dict costs ~1 KB, and pins the parser's memory arenas)."""
        if not rows:
            return
        self.comm_parts["_row"].append(np.asarray(rows, dtype=np.int64))
        strings = self.comm_strings
        for key, column in zip(_COMM_STORED[1:], zip(*values, strict=True), strict=True):
            if key in _OBJECT_FIELDS:
                array = np.empty(len(rows), dtype=object)
                array[:] = [v if v is None else strings.setdefault(v, v) for v in column]
            else:
                array = np.asarray(column, dtype=np.float64)
            self.comm_parts[key].append(array)

    def columns(self, warnings: list[str], path: Path) -> dict[str, Any]:
        if self.skipped:
            warnings.append(
                BadInput(
                    f"{path}: skipped {self.skipped} malformed event(s) "
                    "(missing/invalid name, ts or dur)"
                )
            )
        cols: dict[str, Any] = {}
        for key, parts in self.parts.items():
            cols[key] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            parts.clear()
        for key, table in self.interned.items():
            cols[key + "_values"] = list(table)
        cols["comm"] = {
            key: np.concatenate(parts) if parts else _empty_comm(key)
            for key, parts in self.comm_parts.items()
        }
        self.comm_parts.clear()
        cols["thread_names"] = self.thread_names
        return cols


_COLLECTED = ("name", "cat", "pid", "tid", "ts", "dur", "stream", "correlation", "external_id")


def _empty_comm(key: str) -> np.ndarray:
    dtype: Any = np.int64 if key == "_row" else object if key in _OBJECT_FIELDS else np.float64
    return np.empty(0, dtype=dtype)


def _intern(values: list, table: dict[Any, int]) -> np.ndarray:
    """Codes of ``values`` in ``table`` (new values appended in order of appearance, so
    the codes are those one factorisation of all chunks would give)."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    remap = np.empty(len(uniques), dtype=np.int32)
    for i, value in enumerate(uniques):
        code = table.get(value)
        if code is None:
            code = table[value] = len(table)
        remap[i] = code
    return remap[codes] if len(codes) else np.empty(0, dtype=np.int32)


def _collect_chunk(events: list, acc: _Collector) -> dict[str, Any]:
    """One pass over raw events: keep complete ('X') events and thread names."""
    names: list[str] = []
    cats: list[str] = []
    tss: list[float] = []
    durs: list[float] = []
    pids: list[Any] = []
    tids: list[Any] = []
    streams: list[int] = []
    correlations: list[int] = []
    external_ids: list[int] = []
    comm_rows: list[int] = []
    comm_values: list[tuple] = []
    thread_names = acc.thread_names
    offset = acc.n
    skipped = 0
    gpu_cats = cls.GPU_CATS
    canonical_cat = cls.canonical_category
    keeps_comm_args = acc.keeps_comm_args
    for ev in events:
        if type(ev) is not dict:
            skipped += 1
            continue
        ph = ev.get("ph")
        if ph != "X":
            if ph == "M" and ev.get("name") == "thread_name":
                _note_thread_name(ev, thread_names)
            continue
        name = ev.get("name")
        ts: Any = ev.get("ts")  # JSON: checked just below
        dur: Any = ev.get("dur", 0)
        if (
            type(name) is not str
            or type(ts) not in (int, float)
            or type(dur) not in (int, float)
            or not (-_MAX_ABS_TS_US < ts < _MAX_ABS_TS_US)
            or not (0 <= dur < _MAX_DUR_US)
        ):
            skipped += 1  # NaN fails every comparison above
            continue
        cat = canonical_cat(ev.get("cat"))  # old Kineto spellings too (classify.py)
        args = ev.get("args")
        if type(args) is not dict:
            args = _NO_ARGS
        stream: Any = -1
        if cat in gpu_cats:
            stream = args.get("stream")
            if type(stream) is not int:
                stream = _int_or_none(stream)
                if stream is None:
                    stream = _int_or_none(ev.get("tid"))
                    stream = -1 if stream is None else stream
        corr = args.get("correlation", -1)
        if type(corr) is not int:
            corr = _int_or_none(corr)
            corr = -1 if corr is None else corr
        ext = args.get("External id", -1)
        if type(ext) is not int:
            ext = _int_or_none(ext)
            ext = -1 if ext is None else ext
        key = (name, cat)
        keep = keeps_comm_args.get(key)
        if keep is None:
            keep = cls.is_cpu_comm_name(name) or (cat == "kernel" and cls.is_comm_kernel(name))
            keeps_comm_args[key] = keep
        if keep or "Collective name" in args:
            comm_rows.append(offset + len(names))
            comm_values.append(_comm_row(name, cat == "kernel", args))
        names.append(name)
        cats.append(cat)
        tss.append(ts)
        durs.append(dur)
        pid = ev.get("pid", "")
        tid = ev.get("tid", "")
        pids.append(pid if type(pid) in (int, str) else str(pid))
        tids.append(tid if type(tid) in (int, str) else str(tid))
        streams.append(stream)
        correlations.append(corr)
        external_ids.append(ext)
    acc.skipped += skipped
    return {
        "name": names,
        "cat": cats,
        "ts": tss,
        "dur": durs,
        "pid": pids,
        "tid": tids,
        "stream": streams,
        "correlation": correlations,
        "external_id": external_ids,
        "comm_rows": comm_rows,
        "comm_values": comm_values,
    }


def _note_thread_name(ev: dict, thread_names: dict[tuple[str, str], str]) -> None:
    args = ev.get("args")
    label = args.get("name") if isinstance(args, dict) else None
    if not isinstance(label, str):
        return
    key = (str(ev.get("pid", "")), str(ev.get("tid", "")))
    # Kineto may name a thread twice ("python", then "pt_gloo_runloop"): keep the telling one
    if key not in thread_names or "gloo" in label or "python" in thread_names[key]:
        thread_names[key] = label


_NO_ARGS: dict = {}


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


def read_trace(
    path: Path, limit: int, warnings: list[str] | None = None
) -> tuple[dict[str, Any], _Collector]:
    """The trace's top-level fields (without ``traceEvents``) and its events as compact
    columns. The ``traceEvents`` array is parsed a few MiB at a time, so peak memory is
    the columns plus one chunk, not the parsed JSON of the whole file; a file whose
    array cannot be located is parsed whole (within the size limit). Text that is not
    Unicode (a lone surrogate escape, bytes that are not UTF-8) is replaced with U+FFFD
    and the file parsed whole, with one warning in ``warnings``."""
    try:
        return _read_trace(path, limit, warnings)
    except _NotUnicode:
        pass
    text, replaced = repair_unicode(read_trace_bytes(path, limit, warnings))
    events = _Collector()
    whole = parse_trace(text)
    del text
    trace_events = whole.pop("traceEvents")
    events.add(trace_events)
    del trace_events
    if warnings is not None:
        warnings.append(
            BadInput(
                f"{path}: {replaced} character(s) not valid Unicode (lone surrogate "
                "escapes, bytes that are not UTF-8); replaced with U+FFFD"
            )
        )
    return whole, events


# A \uXXXX escape of a surrogate at the start of an escape (after an even run of
# backslashes): a high one followed by a low one is a pair (kept), any other is lone.
_SURROGATE_ESCAPE_RE = re.compile(
    rb"(?<!\\)((?:\\\\)*)(?:(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)


def repair_unicode(data: bytes) -> tuple[bytes, int]:
    """JSON text with every byte sequence that is not UTF-8 and every lone surrogate
    escape replaced by U+FFFD, and how many were replaced."""
    replaced = 0
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd") - data.count("\ufffd".encode())
        data = text.encode("utf-8")
        del text

    def fix(m: re.Match[bytes]) -> bytes:
        nonlocal replaced
        if m.group(2):  # a pair
            return m.group(0)
        replaced += 1
        return m.group(1) + b"\\ufffd"

    return _SURROGATE_ESCAPE_RE.sub(fix, data), replaced


def _read_trace(
    path: Path, limit: int, notes: list[str] | None = None
) -> tuple[dict[str, Any], _Collector]:
    events = _Collector()
    try:
        doc = _stream_trace(path, limit, events, notes)
    except TraceError:
        raise
    except (orjson.JSONDecodeError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise _read_error(exc) from None
    if doc is None:  # not the usual shape: the whole file at once, as before
        events = _Collector()
        whole = parse_trace(read_trace_bytes(path, limit, notes))
        trace_events = whole.pop("traceEvents")
        events.add(trace_events)
        del trace_events
        doc = whole
    return doc, events


def _read_error(exc: BaseException) -> TraceError:
    if isinstance(exc, orjson.JSONDecodeError):
        text = f"malformed JSON ({_first_line(exc)})"
        return _NotUnicode(text) if "surrogate" in str(exc) else TraceError(text)
    if isinstance(exc, EOFError):
        return TraceError("truncated gzip (compressed stream ends early)")
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return TraceError(f"corrupt gzip ({_first_line(exc)})")
    return TraceError(rundir.read_problem(exc))


# JSON text parsed at once: ~10x that as Python objects at the load's peak. 1 MiB rather
# than 4: a fixed ~50 MiB less on every trace over 4 MiB (300k small events: 205 -> 154
# MiB peak load), no slower (the per-event loop dominates; bench/memory.py).
_CHUNK_BYTES = 1 << 20
_HEAD_BYTES = 16 << 20  # the top-level fields before "traceEvents" must fit in this
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_WHITESPACE = b" \t\r\n"


_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_IN_BYTES = 256 << 10  # compressed bytes handed to zlib at once
_SNIFF_TRAILING = 64 << 10  # how much of the data after a gzip stream is looked at


class _GzipMembers:
    """The inflated bytes of a file of gzip members, read with zlib so that nothing
    is read past the stream: data after the last member that is not another member
    (zeros of a preallocated or crash-recovered file, garbage) ends the stream and is
    described in ``trailing``, not scanned (Python's gzip module reads zero padding a
    byte at a time: minutes for a file padded to GiBs)."""

    def __init__(self, raw: BinaryIO, size: int) -> None:
        self.raw = raw
        self.size = size
        self.pending = b""  # compressed bytes read but not yet given to zlib
        self.inflater: Any = None  # the member being inflated; None between members
        self.done = False
        self.trailing: str | None = None

    def read(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n and not self.done:
            if not self.pending or (self.inflater is None and len(self.pending) < 2):
                more = self.raw.read(_GZIP_IN_BYTES)
                if not more:
                    if self.inflater is not None:
                        raise EOFError("compressed stream ends early")
                    if self.pending:
                        self._trailing_data()
                    self.done = True
                    break
                self.pending += more
                continue
            if self.inflater is None:  # a member must start here, or the stream is over
                if self.pending[:2] != _GZIP_MAGIC:
                    self._trailing_data()
                    self.done = True
                    break
                self.inflater = zlib.decompressobj(31)
            data = self.inflater.decompress(self.pending, n - got)
            if self.inflater.eof:
                self.pending = self.inflater.unused_data
                self.inflater = None
            else:
                self.pending = self.inflater.unconsumed_tail
            if data:
                parts.append(data)
                got += len(data)
        return b"".join(parts)

    def _trailing_data(self) -> None:
        after = self.raw.tell() - len(self.pending)
        look = self.pending[:_SNIFF_TRAILING]
        if len(look) < _SNIFF_TRAILING:
            look += self.raw.read(_SNIFF_TRAILING - len(look))
        kind = "zeros" if not look.strip(b"\0") else "not gzip"
        count = max(self.size - after, len(self.pending))
        self.trailing = f"{count} bytes of trailing data after the gzip stream ({kind}); ignored"
        self.pending = b""


class _Source:
    """A trace file's (decompressed) bytes, chunk by chunk; refused past ``limit``, when
    its first text cannot begin a JSON trace ('{' or '[' after blanks: an all-zero or
    binary file is refused at its first chunk, not read whole) and at a NUL byte (never
    in JSON text). Data after the gzip stream is one note in ``notes``."""

    def __init__(self, path: Path, limit: int, notes: list[str] | None = None) -> None:
        self.path = path
        self.limit = limit
        self.notes = notes
        self.total = 0
        self.text_seen = False
        self.raw = rundir.open_regular(path)  # closed in close()
        try:
            size = os.fstat(self.raw.fileno()).st_size
            if size == 0:
                raise TraceError("empty file")
            gz = self.raw.read(2) == _GZIP_MAGIC
            self.raw.seek(0)
            if not gz and size > limit:
                raise TraceError(_too_big(size, limit))
            self.gz = _GzipMembers(self.raw, size) if gz else None
        except BaseException:
            self.raw.close()
            raise

    def read(self) -> bytes:
        want = min(_CHUNK_BYTES, self.limit + 1 - self.total)
        data = self.gz.read(want) if self.gz is not None else self.raw.read(want)
        start = self.total
        self.total += len(data)
        if self.total > self.limit:
            raise TraceError(_too_big(self.total, self.limit))
        if not self.text_seen:
            text = data.lstrip(_WHITESPACE)
            if text:
                self.text_seen = True
                if text[:1] not in b"{[":
                    at = start + len(data) - len(text)
                    raise TraceError(
                        f"not a JSON trace (its text begins with {bytes(text[:8])!r} at byte "
                        f"{at}, not '{{'); refused"
                    )
        nul = data.find(b"\0")
        if nul >= 0:
            raise TraceError(
                f"malformed JSON (a NUL byte at byte {start + nul}, never in JSON text); refused"
            )
        if not data and self.gz is not None and self.gz.trailing and self.notes is not None:
            note = BadInput(f"{self.path}: {self.gz.trailing}")
            if note not in self.notes:
                self.notes.append(note)
        return data

    def close(self) -> None:
        self.raw.close()


def _stream_trace(
    path: Path, limit: int, events: _Collector, notes: list[str] | None = None
) -> dict[str, Any] | None:
    """Feed the ``traceEvents`` array to ``events`` in chunks; returns the other
    top-level fields, or None when the file is not shaped for streaming."""
    src = _Source(path, limit, notes)
    try:
        buf = bytearray()
        while True:  # the head: everything before the array
            m = _EVENTS_KEY_RE.search(buf)
            if m is not None:
                head: bytes | None = bytes(buf[: m.start()])
                del buf[: m.end() - 1]  # keep the "["
                break
            stripped = buf.lstrip(_WHITESPACE)
            if stripped[:1] == b"[":  # a bare list of events
                head, buf = None, stripped
                break
            if len(buf) > _HEAD_BYTES:
                return None
            if not stripped:
                buf.clear()  # leading whitespace (or a whitespace bomb) is never kept
            chunk = src.read()
            if not chunk:
                if src.total == 0:
                    raise TraceError("empty after decompression")
                return None
            if chunk.strip(_WHITESPACE):  # a chunk of only whitespace (a bomb?) is dropped
                buf += chunk
        doc: dict[str, Any] = {}
        if head is not None:
            try:
                doc = orjson.loads(head + b'"traceEvents":[]}')
            except orjson.JSONDecodeError:
                return None
            if not isinstance(doc, dict):
                return None
        want = _CHUNK_BYTES
        while True:
            if len(buf) < want:
                chunk = src.read()
                if chunk:
                    if chunk.strip(_WHITESPACE):
                        buf += chunk
                    continue
                break
            want = _CHUNK_BYTES if _take_events(buf, events) else 2 * len(buf)
    finally:
        src.close()
    # what is left: the last events, "]", and (for an object) the fields after the array
    rest = orjson.loads(bytes(buf) if head is None else b'{"traceEvents":' + bytes(buf))
    del buf
    last = rest if head is None else rest.pop("traceEvents", None)
    if not isinstance(last, list):
        raise TraceError("not a profiler trace (no 'traceEvents' list)")
    events.add(last)
    if head is not None:
        doc.pop("traceEvents", None)
        doc.update(rest)
    return doc


def _take_events(buf: bytearray, events: _Collector) -> bool:
    """Parse the complete events at the front of ``buf`` ("[" then events): cut after
    an event's closing brace that a comma and another event follow, and drop them from
    ``buf``. A cut inside a string or a nested value leaves unbalanced JSON, which
    orjson rejects; then an earlier cut is tried."""
    end = len(buf)
    for _ in range(3):
        pos = buf.rfind(b"}", 1, end)
        if pos < 0:
            return False
        end = pos
        comma = _skip_space(buf, pos + 1)
        if comma >= len(buf) or buf[comma] != 0x2C:  # ","
            continue
        nxt = _skip_space(buf, comma + 1)
        if nxt >= len(buf) or buf[nxt] != 0x7B:  # "{"
            continue
        piece = buf[: comma + 1]
        piece[comma] = 0x5D  # "]"
        try:
            parsed = orjson.loads(piece)
        except orjson.JSONDecodeError:
            continue
        del piece
        events.add(parsed)
        del parsed
        del buf[1:nxt]
        return True
    return False


def _skip_space(buf: bytearray, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WHITESPACE:
        i += 1
    return i


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
    meta = TraceMeta(
        rank=-1,
        world_size=_int_or_none(dist.get("world_size")) if dist else None,
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


def _id_column(values: list[int]) -> np.ndarray:
    """Stream, correlation and external ids as int32 where every value fits (they do in
    every trace seen: 4 bytes an event each instead of 8), else int64; ids beyond int64
    (a damaged trace) are unknown (-1). Chunks of both widths concatenate to int64."""
    try:
        column = np.asarray(values, dtype=np.int64)
    except OverflowError:
        converted = (_int_or_none(v) for v in values)
        column = np.fromiter((-1 if v is None else v for v in converted), np.int64, len(values))
    return _narrow(column)


_INT32 = np.iinfo(np.int32)


def _narrow(column: np.ndarray) -> np.ndarray:
    """``column`` as int32 when all its values fit (checked; an empty one too, so that
    chunks concatenate to int32), else unchanged."""
    if not len(column) or (_INT32.min <= column.min() and column.max() <= _INT32.max):
        return column.astype(np.int32)
    return column


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


# --------------------------------------------------------------------------- communication


def _nelems_from_dims(dims: Any) -> int | None:
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if not isinstance(first, list) or not first:
        return None
    tensors = first if all(isinstance(d, list) for d in first) else [first]
    total = 0
    for shape in tensors:
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return None
        total += math.prod(shape)
    return total


def _comm_row(name: str, is_kernel: bool, args: dict) -> tuple:
    op = cls.normalise_op(args.get("Collective name")) if "Collective name" in args else None
    if op is None:
        op = cls.kernel_comm_op(name) if is_kernel else cls.normalise_op(name)
    dtype = args.get("dtype")
    if not isinstance(dtype, str):
        dtype = None
        types = args.get("Input type")
        if isinstance(types, list) and types and cls.dtype_size(str(types[0])):
            dtype = str(types[0])
    # Only a guess: NCCL runs float all_to_all as SendRecv ..._int8_t kernels. Used when
    # neither the kernel's args nor its CPU-side op (see _fill_kernels_from_cpu) say.
    guess = cls.kernel_dtype(name) if is_kernel else None
    nelems = [_num(args.get(k)) for k in ("In msg nelems", "Out msg nelems")]
    known = [n for n in nelems if n is not None and n >= 0]
    count = max(known) if known else _nelems_from_dims(args.get("Input Dims"))
    size = cls.dtype_size(dtype)  # without a recorded dtype, bytes come later
    nbytes = float(count) * size if count is not None and size else math.nan
    pg = args.get("Process Group Name")
    pg_size = _num(args.get("Group size"))
    seq = _num(args.get("Seq"))
    return (
        op,
        nbytes,
        dtype,
        str(pg) if pg is not None else None,
        math.nan if pg_size is None else pg_size,
        math.nan if seq is None else seq,
        math.nan if count is None else float(count),
        guess,
    )


_COMM_FIELDS = ("comm_op", "comm_bytes", "comm_dtype", "pg_name", "pg_size", "seq", "comm_nelems")
_DTYPE_GUESS = "_dtype_guess"  # the kernel name's dtype, the last resort
_COMM_STORED = ("_row", *_COMM_FIELDS, _DTYPE_GUESS)  # the collector's comm arrays


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


def _uncompressed_size_hint(path: Path) -> int:
    """A guess at the trace's uncompressed size (for planning only, never trusted): a
    gzip's trailer (mod 2**32) or 10x its size, whichever is larger; never above the
    size limit, past which nothing is held (a gzip padded with GiBs of zeros is small)."""
    try:
        with rundir.open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != _GZIP_MAGIC:
                return min(size, max_trace_bytes())
            fh.seek(-4, os.SEEK_END)
            trailer = int.from_bytes(fh.read(4), "little")
        return min(max(trailer, 10 * size), max_trace_bytes())
    except OSError:
        return 0


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
            f"({_ranges(missing)}); analysing the {len(traces)} present"
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
