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
import tempfile
import weakref
from typing import IO, Any

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
        if self._failed or len(data) < MIN_SPILL:
            return data
        try:
            fd = self._descriptor()
            offset = self._end
            written = 0
            while written < len(data):
                n = os.pwrite(fd, memoryview(data)[written:], offset + written)
                if n <= 0:
                    raise OSError(f"wrote {n} bytes")
                written += n
        except OSError:
            self._failed = True  # e.g. a full disk: keep this and the rest in memory
            return data
        self._end += len(data)
        return SpilledBytes(self, offset, len(data))

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

    @property
    def size(self) -> int:
        """Bytes written to the file."""
        return self._end


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
