"""Trace files: the rank a file's name gives, the size limit, and the bounded reading
of a file's (decompressed) bytes, chunk by chunk: gzip member by member, refused past
the limit, at text that cannot begin a JSON trace and at a NUL byte.

Every open goes through :func:`gpudiag.rundir.open_regular` (a regular file only).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpudiag import rundir
from gpudiag.analysis.trace_model import TraceError, _first_line
from gpudiag.rundir import BadInput, trace_name_stem

# A trace above this (uncompressed) is refused rather than loaded: parsing JSON costs
# several times its size in memory. Override with GPUDIAG_MAX_TRACE_BYTES.
DEFAULT_MAX_TRACE_BYTES = 1 << 30

_RANK_IN_NAME_RES = (
    re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"worker[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[-_.])(\d+)$"),
)
_TB_HANDLER_RE = re.compile(r"^(.*)\.(\d{10,})$")


class _NotUnicode(TraceError):
    """JSON text that orjson refuses for its Unicode alone (a lone surrogate escape,
    bytes that are not UTF-8): read again with those replaced (:func:`repair_unicode`)."""


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
CHUNK_BYTES = 1 << 20
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
        want = min(CHUNK_BYTES, self.limit + 1 - self.total)
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
