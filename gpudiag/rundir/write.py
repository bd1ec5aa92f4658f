"""The writers capture uses: JSON documents (atomically, or from a reserve on a full
disk), append-only JSON Lines tables, the in-place last-call slot, and the write
problems they note instead of raising."""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpudiag.rundir.files import _size_text
from gpudiag.rundir.layout import (
    LAST_CALL,
    LAST_CALL_BYTES,
    RESERVE,
    node_dir,
    rank_dir,
    table_path,
)
from gpudiag.rundir.text import _json_default, _short, dumps_line, fs_safe, one_line

# --------------------------------------------------------------------------- write problems
#
# Capture writes from inside the user's training (step hooks, collective wrappers) and
# from the launcher. A full disk or any other I/O error must never reach user code: the
# writer that failed stops (that table is no longer recorded), the first problem of a
# process is said once on stderr, and every problem is kept here so the worker's
# status.json and the launcher's manifest can mark the run ``incomplete`` with reasons.

_PROBLEMS: list[str] = []
_PROBLEMS_LOCK = threading.Lock()


def note_write_problem(path: str | os.PathLike[str], exc: BaseException, what: str = "") -> str:
    """Record that writing ``path`` failed; the first time in this process, say so on
    stderr. Returns the reason as recorded."""
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else _short(exc)
    if (
        isinstance(exc, OSError)
        and exc.errno == errno.EFBIG
        and "RLIMIT_FSIZE" not in detail
        and (limit := file_size_limit())
    ):
        detail = f"{detail}: the file size limit (RLIMIT_FSIZE, ulimit -f) is {_size_text(limit)}"
    return note_problem(
        f"{path}: {detail}" + (f" ({what})" if what else ""),
        f"cannot write {path} ({detail}): gpudiag stops recording it and the run will be "
        "marked incomplete; training goes on",
    )


def note_problem(reason: str, message: str = "") -> str:
    """Record ``reason`` (why the run's record is incomplete); the first problem of this
    process is said on stderr (``message``, else the reason), on one line."""
    with _PROBLEMS_LOCK:
        first = not _PROBLEMS
        if reason not in _PROBLEMS:
            _PROBLEMS.append(reason)
    if first:
        try:
            print(f"gpudiag: {one_line(message or reason)}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
    return reason


def file_size_limit() -> int | None:
    """This process's file size limit in bytes (RLIMIT_FSIZE, ``ulimit -f``), or None
    when there is none. Python ignores SIGXFSZ, so a write past it fails with EFBIG."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def deleted_while_written(path: str | os.PathLike[str]) -> str:
    """The reason recorded when a file or directory the run wrote was deleted."""
    return f"{path} was deleted while the run wrote it; its rows are lost"


def why_unwritable(folder: str | os.PathLike[str]) -> OSError:
    """Why nothing can be written in ``folder``, as the OS says it now (a folder made
    read-only mid-run is EACCES / EROFS, not a full disk: eleventh probe of issue 28);
    ENOSPC when a file can be created there after all (the write that failed was bigger)."""
    probe = Path(folder) / f".gpudiag_probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def write_problems() -> list[str]:
    """Every write problem noted in this process, in order (empty when none)."""
    with _PROBLEMS_LOCK:
        return list(_PROBLEMS)


# --------------------------------------------------------------------------- writing


def write_json_atomic(path: str | os.PathLike[str], obj: Any, reserve: Path | None = None) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one.
    On failure (full disk...) the temporary file is removed and the error raised.

    ``reserve`` (a file of :func:`reserve_space`, consumed): the document is written over
    that file's blocks, so it lands on a full disk (on filesystems that overwrite in
    place: ext4, xfs, tmpfs); when that fails, the reserve is freed and the document
    written as usual."""
    path = Path(path)
    if reserve is not None and _write_json_into(reserve, path, obj):
        return
    release_space(reserve)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        _write_json_file(tmp, obj)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_json_exclusive(path: str | os.PathLike[str], obj: Any) -> None:
    """Create ``path`` with this JSON, complete, or raise FileExistsError when it exists.
    Two launchers given one run directory: the first to create the manifest owns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        _write_json_file(tmp, obj)
        try:
            os.link(tmp, path)  # atomic, and fails when path exists
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links: claim by O_EXCL, then fill
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(tmp.read_text(encoding="utf-8"))
    finally:
        _unlink_quietly(tmp)


def _write_json_file(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2, default=_json_default)
    if "\\ud" in text:  # maybe a lone surrogate: a path or argument that is not UTF-8
        text = json.dumps(fs_safe(obj), indent=2, default=_json_default)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _write_json_into(reserve: Path, path: Path, obj: Any) -> bool:
    """Write ``obj`` as ``path`` over the blocks of the file ``reserve`` (renamed to a
    temporary name, overwritten from its start, cut to the document's length, renamed
    to ``path``). False, with the reserve left where it was, when that fails."""
    text = json.dumps(obj, indent=2, default=_json_default)
    if "\\ud" in text:  # maybe a lone surrogate: a path or argument that is not UTF-8
        text = json.dumps(fs_safe(obj), indent=2, default=_json_default)
    data = (text + "\n").encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        os.rename(reserve, tmp)
    except OSError:
        return False
    try:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            view = memoryview(data)
            offset = 0
            while offset < len(data):
                offset += os.pwrite(fd, view[offset:], offset)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.rename(tmp, reserve)
        except OSError:
            _unlink_quietly(tmp)
        return False
    return True


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def create_unique_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path``, or ``path-2``, ``path-3``... when it exists: ``os.mkdir`` is atomic,
    so two runs started in the same second never share a directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        candidate = path if i == 1 else path.with_name(f"{path.name}-{i}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{path}: too many runs with this name")


def reserve_space(path: str | os.PathLike[str], nbytes: int) -> Path | None:
    """Write ``nbytes`` of real data at ``path`` (None when that fails): space kept so
    that status.json and the manifest can still be written once the disk is full.
    :func:`release_space` frees it just before those last writes."""
    path = Path(path)
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * nbytes)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        _unlink_quietly(path)
        return None
    return path


def release_space(path: Path | None) -> None:
    if path is not None:
        _unlink_quietly(path)


# Each rank's reserve: summary.json and status.json on a full disk. The launcher writes
# one per local rank before anything else (:func:`handed_reserve_path`) and refuses the
# run when it cannot; a rank takes its own by renaming it (no new blocks), and writes
# status.json over the reserve's own blocks (:func:`write_json_atomic` ``reserve=``).
RANK_RESERVE_BYTES = 64 * 1024
STATUS_RESERVE_BYTES = 32 * 1024  # of which kept for status.json until it is written


def handed_reserve_path(run: str | os.PathLike[str], node: int, local_rank: int) -> Path:
    """The reserve the launcher of ``node`` wrote for its local rank ``local_rank``."""
    return Path(run) / f"{RESERVE}.node{node}.local{local_rank}"


def reserve_for_ranks(run: str | os.PathLike[str], node: int, count: int) -> list[Path] | None:
    """The launcher's reserves for its ``count`` local ranks (:data:`RANK_RESERVE_BYTES`
    each), or None (and none left behind) when the disk cannot hold them all."""
    made: list[Path] = []
    for local in range(count):
        path = reserve_space(handed_reserve_path(run, node, local), RANK_RESERVE_BYTES)
        if path is None:
            for done in made:
                release_space(done)
            return None
        made.append(path)
    return made


def adopt_reserve(source: Path | None, target: str | os.PathLike[str]) -> Path | None:
    """Move a reserve (a launcher's handed one, or a rank's own when the rank changes)
    to ``target`` without writing a block: a rename. None when there is none to take
    (another process took it, or none was made)."""
    if source is None:
        return None
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        # a directory needs a block on most filesystems: take it from the reserve
        try:
            size = os.stat(source).st_size
            os.truncate(source, max(0, size - 8192))
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
    try:
        os.rename(source, target)
    except OSError:
        return None
    return target


def shrink_reserve(path: Path | None, nbytes: int) -> None:
    """Free all of a reserve but its first ``nbytes`` (kept for :func:`write_json_atomic`
    with ``reserve=``)."""
    if path is None:
        return
    try:
        if os.stat(path).st_size > nbytes:
            os.truncate(path, nbytes)
    except OSError:
        pass


# This process's id, kept current across fork (os.getpid() is a system call on the
# hot path of every row): a writer writes only from the process that opened it.
_CURRENT_PID = [os.getpid()]


def _note_forked_child() -> None:
    _CURRENT_PID[0] = os.getpid()


os.register_at_fork(after_in_child=_note_forked_child)


class JsonlWriter:
    """Append-only JSON Lines table. Each row (or batch of rows) goes out in one
    ``write`` call on an unbuffered descriptor, so a crash loses at most the row being
    written (the reader skips a torn last line).

    Never raises for I/O: when opening or writing fails (full disk, EFBIG, a vanished
    directory) the writer cuts the file back to its last whole row, notes the problem
    (:func:`note_write_problem`), closes, and ignores every later row; ``failed`` then
    holds the reason. A process the writing one forks (the script's own os.fork or
    fork-context multiprocessing) writes nothing: the table is the rank's."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.failed: str | None = None
        self._pid = _CURRENT_PID[0]
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0  # bytes of whole rows in the file
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Called with the lock held (or from __init__)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.ftruncate(fd, self._size)  # drop a partly written row
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass
        self.failed = note_write_problem(self.path, exc, "stopped recording this table")

    def _append(self, text: str) -> None:
        if _CURRENT_PID[0] != self._pid:
            return
        data = text.encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
                self._size += len(data)
            except OSError as exc:
                self._fail(exc)

    def write(self, row: dict[str, Any]) -> None:
        self._append(dumps_line(row))

    def write_text(self, line: str) -> None:
        """Append one row already serialised as a JSON object ending in a newline: the
        hot-path form (a per-step row formatted directly costs ~1 µs, json.dumps ~10)."""
        self._append(line)

    def write_many(self, rows: Iterable[dict[str, Any]]) -> None:
        text = "".join(dumps_line(r) for r in rows)
        if text:
            self._append(text)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink == 0:  # deleted (rm -rf of the run) while open
                    self.failed = note_problem(deleted_while_written(self.path))
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SlotWriter:
    """One small JSON document rewritten in place (one ``pwrite`` at offset 0, padded with
    spaces to a fixed size): what a rank is doing right now, left behind when it dies in
    native code before any buffer is flushed. Never raises; the first error disables it.
    Written only from the process that opened it (not a forked child)."""

    def __init__(self, path: str | os.PathLike[str], size: int = LAST_CALL_BYTES) -> None:
        self.path = Path(path)
        self.size = size
        self._pid = _CURRENT_PID[0]
        self._fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            note_write_problem(self.path, exc)

    def write(self, obj: dict[str, Any]) -> None:
        if self._fd is None or _CURRENT_PID[0] != self._pid:
            return
        data = dumps_line(obj).rstrip("\n").encode("utf-8", "replace")
        if len(data) >= self.size:
            return  # a slot too small for this call: keep the file a whole document
        try:
            os.pwrite(self._fd, data.ljust(self.size - 1) + b"\n", 0)
        except OSError as exc:
            note_write_problem(self.path, exc)
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def open_last_call(run: str | os.PathLike[str], rank: int) -> SlotWriter:
    return SlotWriter(rank_dir(run, rank) / LAST_CALL)


def open_rank_table(run: str | os.PathLike[str], rank: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(rank_dir(run, rank), table))


def open_node_table(run: str | os.PathLike[str], node: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(node_dir(run, node), table))


def write_rank_json(
    run: str | os.PathLike[str], rank: int, name: str, obj: Any, reserve: Path | None = None
) -> None:
    write_json_atomic(rank_dir(run, rank) / name, obj, reserve)
