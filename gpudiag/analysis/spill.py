"""Packed per-rank bytes kept in a temporary file instead of the client's memory.

Each rank's packed timeline and activity sets (intervals.pack_ints) are the largest part
of what the client keeps per rank, and they are read rarely: the activity sets once per
rank by the cross-rank analyses, the timeline when a report or the dashboard draws it.
:class:`SpillFile` appends them to one unlinked temporary file (``tempfile``: ``TMPDIR``)
and hands back a :class:`SpilledBytes` handle read back with ``os.pread``, so the bytes
sit in the page cache, which the kernel may drop, not in the process.

Where the file cannot be written (no temporary directory, a full disk, no ``os.pread``),
the bytes stay in memory: the analysis is the same, only the memory differs.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np
import pandas as pd

# Bytes below this stay in memory: a handle costs about as much.
MIN_SPILL = 256


class SpillFile:
    """One analysis' spilled bytes: an unlinked temporary file, written by appending."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._end = 0
        self._failed = not hasattr(os, "pread")

    def keep(self, data: bytes) -> Blob:
        """``data`` as a handle into the file, or ``data`` itself where it is small or
        cannot be written."""
        return self.keep_parts([data])

    def keep_parts(self, parts: Sequence[bytes | memoryview]) -> Blob:
        """The parts, one after another, as one handle (or their joined bytes where
        they are small or cannot be written): no copy of them all is made here."""
        total = sum(len(part) for part in parts)
        if self._failed or total < MIN_SPILL:
            return _joined(parts)
        try:
            fd = self._descriptor()
            offset = at = self._end
            for part in parts:
                view = memoryview(part).cast("B")
                written = 0
                while written < len(view):
                    n = os.pwrite(fd, view[written:], at + written)
                    if n <= 0:
                        raise OSError(f"wrote {n} bytes")
                    written += n
                at += written
        except OSError:
            self._failed = True  # e.g. a full disk: keep this and the rest in memory
            return _joined(parts)
        self._end = at
        return SpilledBytes(self, offset, total)

    def _descriptor(self) -> int:
        if self._file is None:
            file = tempfile.TemporaryFile(prefix="gpudiag-spill-")  # noqa: SIM115 - kept open
            weakref.finalize(self, file.close)  # closed with the analysis' last handle
            self._file = file
        return self._file.fileno()

    def read(self, offset: int, length: int) -> bytes:
        assert self._file is not None
        data = os.pread(self._file.fileno(), length, offset)
        if len(data) != length:
            raise OSError(f"spill file: read {len(data)} of {length} bytes at {offset}")
        return data

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from ``offset`` (no copy of the bytes on the way)."""
        assert self._file is not None
        done = 0
        while done < len(buffer):
            n = os.preadv(self._file.fileno(), [buffer[done:]], offset + done)
            if n <= 0:
                raise OSError(f"spill file: read {done} of {len(buffer)} bytes at {offset}")
            done += n

    @property
    def size(self) -> int:
        """Bytes written to the file."""
        return self._end


def _joined(parts: Sequence[bytes | memoryview]) -> bytes:
    """The parts' bytes (one bytes part: itself, not a copy)."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    return b"".join(parts)


class SpilledBytes:
    """Bytes kept in a :class:`SpillFile`; pickled (or copied) as the bytes themselves."""

    __slots__ = ("file", "length", "offset")

    def __init__(self, file: SpillFile, offset: int, length: int) -> None:
        self.file = file
        self.offset = offset
        self.length = length

    def read(self) -> bytes:
        return self.file.read(self.offset, self.length)

    def __len__(self) -> int:
        return self.length

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (self.read(),))


Blob = bytes | SpilledBytes


def as_bytes(blob: Blob) -> bytes:
    """The bytes of ``blob``, wherever they are kept."""
    return blob.read() if isinstance(blob, SpilledBytes) else blob


class SpilledTable:
    """A result table kept in a :class:`SpillFile` column by column, read back by the
    columns (and first rows) a reader asks for: the per-call tables of a many-rank run
    (every collective call of every rank, docs/cluster.md) need not sit in memory
    together, nor beside the analyses that read them. Each read builds a new frame with
    its own arrays (the reader may change it).

    :meth:`build` takes the table in pieces (a few ranks' rows at a time) and spills each
    as it comes, so the whole table is never in memory: a read equals ``pd.concat`` of
    the pieces (``ignore_index``), dtypes included. Kept in memory as given where there
    is no spill file or a piece is not a plain table (an index other than 0..n-1,
    repeated column names, other columns than the first piece's); a column whose bytes
    cannot be written stays in memory as bytes (SpillFile.keep)."""

    __slots__ = ("_columns", "_frame", "_header", "_rows")

    def __init__(self, frame: pd.DataFrame, spill: SpillFile | None = None) -> None:
        self._rows = 0
        self._header = frame.columns
        self._frame: pd.DataFrame | None = None
        self._columns: dict[Any, list[_Piece]] = {}
        if spill is None or not _plain(frame):
            self._frame = frame
            self._rows = len(frame)
        else:
            self._columns = {name: [] for name in frame.columns}
            self._append(frame, spill)

    @classmethod
    def build(cls, pieces: Iterable[pd.DataFrame], spill: SpillFile | None) -> SpilledTable | None:
        """The table of these pieces (None when there is none), each spilled as it comes."""
        table: SpilledTable | None = None
        held: list[pd.DataFrame] = []  # where the pieces cannot be spilled: joined at the end
        for piece in pieces:
            if table is None:
                table = cls(piece, spill)
            elif table._frame is not None:
                held.append(piece)
            elif spill is not None and _plain(piece) and piece.columns.equals(table._header):
                table._append(piece, spill)
            else:  # unlike the first pieces: in memory, joined as pd.concat joins them
                whole = table.frame()
                table._columns, table._frame = {}, whole
                held.append(piece)
        if table is not None and held:
            joined = pd.concat([table._frame, *held], ignore_index=True)
            table._frame, table._header, table._rows = joined, joined.columns, len(joined)
        return table

    def _append(self, piece: pd.DataFrame, spill: SpillFile) -> None:
        for name, parts in self._columns.items():
            parts.append(_Piece.keep(piece[name], spill))
        self._rows += len(piece)

    @classmethod
    def of_table(cls, table: pd.DataFrame | SpilledTable) -> SpilledTable:
        """``table`` itself, or a frame kept in memory as it is: a reader of pieces
        takes either."""
        return table if isinstance(table, SpilledTable) else cls(table)

    @classmethod
    def of(cls, columns: Sequence[str] = ()) -> SpilledTable:
        """An empty table of these columns (object dtype)."""
        return cls(pd.DataFrame({c: pd.Series(dtype=object) for c in columns}))

    def __len__(self) -> int:
        return self._rows

    @property
    def columns(self) -> list[Any]:
        return list(self._header)

    def __contains__(self, column: object) -> bool:
        return column in self._header

    @property
    def spilled(self) -> bool:
        """Whether the rows are in the spill file (not in memory as a frame)."""
        return self._frame is None

    def frame(self, columns: Sequence[Any] | None = None, rows: int | None = None) -> pd.DataFrame:
        """The table; or only those of ``columns`` it has, in that order; or its first
        ``rows`` rows: what a reader needs, not the whole table."""
        n = self._rows if rows is None else max(min(rows, self._rows), 0)
        if self._frame is not None:
            return self._frame.iloc[:n][self._names(columns)].copy()
        names, header = self._names(columns), self._header_of(columns)
        return pd.DataFrame(
            {name: _read(self._columns[name], n) for name in names}, columns=header, copy=False
        )

    def pieces(self, columns: Sequence[Any] | None = None) -> Iterator[pd.DataFrame]:
        """The table in the pieces :meth:`build` took (one where it is in memory), each
        of ``columns`` as :meth:`frame`, indexed from 0: ``pd.concat`` of them is
        ``frame(columns)``. A reader that works on the pieces the table was made of
        (comms.collective_pieces: whole ranks) holds one at a time."""
        if self._frame is not None:
            yield self.frame(columns)
            return
        names, header = self._names(columns), self._header_of(columns)
        first = next(iter(self._columns.values()), [])
        for i, piece in enumerate(first):
            yield pd.DataFrame(
                {name: _read([self._columns[name][i]], piece.rows) for name in names},
                columns=header,
                copy=False,
            )

    def uniform(self, columns: Sequence[Any] | None = None) -> bool:
        """Whether each of ``columns`` has one dtype in every piece: a reader that joins
        some rows of several pieces then gets the whole table's dtypes."""
        if self._frame is not None:
            return True
        return all(
            len({str(p.dtype) for p in self._columns[name]}) <= 1 for name in self._names(columns)
        )

    def _names(self, columns: Sequence[Any] | None) -> list[Any]:
        """The columns asked for that the table has, in that order (None: all)."""
        return self.columns if columns is None else [c for c in columns if c in self]

    def _header_of(self, columns: Sequence[Any] | None) -> pd.Index:
        names = self._names(columns)
        return self._header if columns is None else pd.Index(names, dtype=self._header.dtype)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a dashboard's cache): the rows
        return (SpilledTable, (self.frame(),))


class SpilledParts:
    """Rows sorted into ``count`` parts on disk (an out-of-core shuffle): :meth:`add`
    spills each piece's rows of each part, :meth:`take` reads one part back, its rows in
    the order they were added. A reader that needs whole groups of rows (one matched
    call, one rank) that are spread over many pieces then holds one part at a time."""

    def __init__(self, count: int, spill: SpillFile) -> None:
        self._spill = spill
        self._parts: list[list[SpilledTable]] = [[] for _ in range(count)]

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, frame: pd.DataFrame, part: np.ndarray) -> None:
        """Spill ``frame``'s rows, row i to part ``part[i]`` (0 <= part < count)."""
        if not len(frame):
            return
        order = np.argsort(part, kind="stable")
        ordered = part[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        for start, end in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
            rows = frame.take(order[start:end]).reset_index(drop=True)
            self._parts[int(ordered[start])].append(SpilledTable(rows, self._spill))

    def take(self, index: int) -> pd.DataFrame | None:
        """Part ``index``'s rows (None when it has none), read once: then forgotten."""
        kept, self._parts[index] = self._parts[index], []
        if not kept:
            return None
        frames = [table.frame() for table in kept]
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _plain(frame: pd.DataFrame) -> bool:
    index = frame.index
    return (
        isinstance(index, pd.RangeIndex)
        and index.start == 0
        and index.step == 1
        and frame.columns.is_unique
        and not isinstance(frame.columns, pd.MultiIndex)
    )


class _Piece:
    """One piece of one column of a :class:`SpilledTable`: a numpy number column as a
    :class:`SpilledArray` (read straight into the array), any other as its pickled
    values (our own file, never a run directory's)."""

    __slots__ = ("array", "blob", "dtype", "rows")

    def __init__(self, dtype: Any, rows: int, array: SpilledArray | None, blob: Blob) -> None:
        self.dtype = dtype
        self.rows = rows
        self.array = array
        self.blob = blob

    @property
    def raw(self) -> bool:
        return self.array is not None

    @classmethod
    def keep(cls, column: pd.Series, spill: SpillFile) -> _Piece:
        dtype = column.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
            return cls(dtype, len(column), SpilledArray.keep(column.to_numpy(), spill), b"")
        data = pickle.dumps(column.array, protocol=pickle.HIGHEST_PROTOCOL)
        return cls(dtype, len(column), None, spill.keep(data))

    def values(self, rows: int) -> Any:
        """The first ``rows`` values (a pickled piece: its array)."""
        if self.array is not None:
            return self.array.read(0, rows)
        return pickle.loads(as_bytes(self.blob))[:rows]  # noqa: S301 - written by keep

    def read_into(self, out: np.ndarray) -> None:
        assert self.array is not None
        self.array.read_into(out, 0)


class SpilledArray:
    """A 1-d numpy array kept in a :class:`SpillFile`, read back whole or a slice at a
    time: numbers as their raw bytes; objects (a folded table's interned strings, None,
    NaN) as int32 codes into their distinct values, which stay in memory."""

    __slots__ = ("blob", "dtype", "length", "uniques")

    def __init__(self, blob: Blob, dtype: np.dtype, length: int, uniques: np.ndarray | None):
        self.blob = blob
        self.dtype = dtype  # of the array read back
        self.length = length
        self.uniques = uniques  # objects: the values the codes stand for

    @classmethod
    def keep(cls, values: np.ndarray, spill: SpillFile) -> SpilledArray:
        """``values`` in ``spill``; TypeError where an object cannot be hashed (it is
        then not kept)."""
        return cls.keep_chunks([values], spill)

    def __len__(self) -> int:
        return self.length

    @classmethod
    def keep_chunks(cls, chunks: Sequence[np.ndarray], spill: SpillFile) -> SpilledArray:
        """:meth:`keep` of the chunks joined, written chunk by chunk (never joined in
        memory); TypeError where an object cannot be hashed."""
        dtype = chunks[0].dtype
        if any(chunk.dtype != dtype for chunk in chunks):
            return cls.keep(np.concatenate(chunks), spill)
        length = sum(len(chunk) for chunk in chunks)
        if dtype.kind in "biuf":
            parts = [np.ascontiguousarray(chunk).data.cast("B") for chunk in chunks]
            return cls(spill.keep_parts(parts), dtype, length, None)
        seen: dict[object, int] = {}
        uniques: list[object] = []
        codes = [_codes_into(chunk, seen, uniques).tobytes() for chunk in chunks]
        return cls(spill.keep_parts(codes), dtype, length, _distinct(uniques))

    def read(self, start: int = 0, rows: int | None = None) -> np.ndarray:
        """``array[start : start + rows]`` (to the end without ``rows``), its own copy."""
        rows = self.length - start if rows is None else rows
        stored = np.dtype(np.int32) if self.uniques is not None else self.dtype
        out = np.empty(max(rows, 0), dtype=stored)
        self.read_into(out, start)
        return out if self.uniques is None else self.uniques[out]

    def read_into(self, out: np.ndarray, start: int) -> None:
        """Fill ``out`` (of the stored dtype: numbers, or codes) from row ``start``."""
        if not len(out):
            return
        at = start * out.itemsize
        if isinstance(self.blob, SpilledBytes):
            self.blob.file.read_into(self.blob.offset + at, out.data.cast("B"))
        else:
            out[:] = np.frombuffer(self.blob, dtype=out.dtype, count=len(out), offset=at)


def _value_key(value: object) -> object:
    """Equal values share a code: NaN is one value (its objects differ; hash(nan) is
    the object's), every other value keyed by its type and itself."""
    if isinstance(value, float) and value != value:
        return (float, "nan")
    return (type(value), value)


def _codes_into(values: np.ndarray, seen: dict[object, int], uniques: list[object]) -> np.ndarray:
    """int32 codes of an object array into ``uniques`` (extended with the values not
    ``seen`` before)."""
    codes = np.empty(len(values), dtype=np.int32)
    for i, value in enumerate(values):
        key = _value_key(value)
        code = seen.get(key)
        if code is None:
            code = seen[key] = len(uniques)
            uniques.append(value)
        codes[i] = code
    return codes


def _distinct(uniques: list[object]) -> np.ndarray:
    distinct = np.empty(len(uniques), dtype=object)
    distinct[:] = uniques
    return distinct


def _read(pieces: list[_Piece], rows: int) -> pd.Series:
    """A column's first ``rows`` rows from its pieces: ``pd.concat`` of them."""
    taken: list[tuple[_Piece, int]] = []
    left = rows
    for piece in pieces:
        if taken and not left:
            break
        taken.append((piece, min(piece.rows, left)))
        left -= taken[-1][1]
    same = len({str(p.dtype) for p, _ in taken}) <= 1
    if taken and same and all(p.raw for p, _ in taken):  # straight into one array
        out = np.empty(rows, dtype=taken[0][0].dtype)
        at = 0
        for piece, n in taken:
            piece.read_into(out[at : at + n])
            at += n
        return pd.Series(out, dtype=out.dtype, copy=False)
    parts = [pd.Series(p.values(n), dtype=p.dtype, copy=False) for p, n in taken]
    if len(parts) == 1:
        return parts[0]
    return pd.concat(parts, ignore_index=True)


def lowest_rank_rows(buckets: SpilledTable | None) -> pd.DataFrame | None:
    """The rows of the lowest rank (the DDP buckets findings.bucket_findings reads), one
    piece at a time."""
    if buckets is None or not len(buckets) or "rank" not in buckets:
        return buckets.frame() if buckets is not None else None
    lowest = min(piece["rank"].min() for piece in buckets.pieces(["rank"]))
    rows = [piece[piece["rank"] == lowest] for piece in buckets.pieces()]
    return pd.concat(rows, ignore_index=True)
