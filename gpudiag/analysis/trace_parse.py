"""Parsing a trace's JSON into compact columns: the ``traceEvents`` array is streamed a
chunk at a time (:func:`read_trace`), each chunk's complete ('X') events reduced at
once to numpy arrays and codes into interned strings (:class:`_Collector`), with the
collectives' args of the events that carry them; a file not shaped for streaming, or
whose text is not Unicode, is parsed whole.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gpudiag.analysis import classify as cls
from gpudiag.analysis import trace_files
from gpudiag.analysis.trace_files import (
    _WHITESPACE,
    _NotUnicode,
    _read_error,
    _Source,
    read_trace_bytes,
)
from gpudiag.analysis.trace_model import _COMM_FIELDS, _DTYPE_GUESS, _OBJECT_FIELDS, TraceError
from gpudiag.numfmt import plural
from gpudiag.rundir import BadInput

_MAX_ABS_TS_US = 4e15  # keeps base + ts*1000 inside int64 (year ~2096 as epoch µs)
_MAX_DUR_US = 1e12  # 11.6 days


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
        self.category_of = _Categories()

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
                    f"{path}: skipped {plural(self.skipped, 'malformed event')} "
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


class _Categories(dict[str, str]):
    """classify.canonical_category of each distinct ``cat`` spelling, worked out once."""

    def __missing__(self, cat: str) -> str:
        canonical = self[cat] = cls.canonical_category(cat)
        return canonical


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
    """One pass over raw events: keep complete ('X') events and thread names (a category
    is canonicalised once per distinct spelling)."""
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
    category_of = acc.category_of
    keeps_comm_args = acc.keeps_comm_args
    no_args = _NO_ARGS
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
        cat: Any = ev.get("cat")  # old Kineto spellings too (classify.py)
        cat = category_of[cat] if type(cat) is str else ""  # as canonical_category
        args = ev.get("args", no_args)
        if type(args) is not dict:
            args = no_args
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
        pids.append(pid if type(pid) is int or type(pid) is str else str(pid))
        tids.append(tid if type(tid) is int or type(tid) is str else str(tid))
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


_HEAD_BYTES = 16 << 20  # the top-level fields before "traceEvents" must fit in this
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')


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
        want = trace_files.CHUNK_BYTES
        while True:
            if len(buf) < want:
                chunk = src.read()
                if chunk:
                    if chunk.strip(_WHITESPACE):
                        buf += chunk
                    continue
                break
            want = trace_files.CHUNK_BYTES if _take_events(buf, events) else 2 * len(buf)
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


_COMM_STORED = ("_row", *_COMM_FIELDS, _DTYPE_GUESS)  # the collector's comm arrays
