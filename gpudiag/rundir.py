"""The gpudiag run directory: the one place that knows its file names and formats.

Capture (inside the training processes and the launcher) writes through the writer
helpers here; analysis and the dashboard read through :func:`load_run`. See
docs/run-format.md for the format itself and why it is JSON Lines.

Layout (format version 1)::

    <run>/manifest.json                    launcher (node 0); atomically replaced
    <run>/manifest.node<N>.json            launchers of nodes N > 0
    <run>/lint.json                        lint result for the traced script
    <run>/hang_report.json                 only when the hang watchdog fired (node K: .node<K>.json)
    <run>/bench.json                       only for runs made by `gpudiag bench`
    <run>/traces/rank<R>.pt.trace.json.gz  Kineto trace of the profiled window
    <run>/rank<R>/steps.jsonl              one row per training step
    <run>/rank<R>/collectives.jsonl        one row per collective (Flight Recorder et al.)
    <run>/rank<R>/collective_times.jsonl   completion/start stamps matched on (pg, seq)
    <run>/rank<R>/regions.jsonl            gpudiag.region(...) intervals
    <run>/rank<R>/ddp_stats.jsonl          DDP runtime logging data per sampled step
    <run>/rank<R>/rank_info.json           rank, local rank, host, pid, backend, device
    <run>/rank<R>/status.json              how the rank ended (written last)
    <run>/rank<R>/summary.json             small per-rank summary (written at rank end)
    <run>/rank<R>/stacks.txt               Python stacks dumped by the hang watchdog
    <run>/rank<R>/inflight.json            collectives in flight when the watchdog fired
    <run>/rank<R>/hang_request             the watchdog's request for inflight.json (control)
    <run>/rank<R>/inflight_live.json       collectives in flight for over a second (live view)
    <run>/rank<R>/last_call.json           the user collective the rank entered last (kept on an abort)
    <run>/node<N>/clock.json               the node's clock offset to node 0 (multi-node)
    <run>/node<N>/gpu_samples.jsonl        NVML samples, every local GPU
    <run>/node<N>/host_samples.jsonl       host CPU/memory samples (always; the only ones without NVML)

All times are integer nanoseconds since the Unix epoch ("trace clock": a Kineto event
at ``ts`` µs is at ``baseTimeNanoseconds + ts * 1000``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import gzip
import json
import os
import re
import socket
import stat
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

FORMAT_VERSION = 1

MANIFEST = "manifest.json"
LINT = "lint.json"
HANG_REPORT = "hang_report.json"
CLOCK = "clock.json"  # node<N>/clock.json: the node's clock offset to node 0
TRACES_DIR = "traces"

STEPS = "steps"
COLLECTIVES = "collectives"
COLLECTIVE_TIMES = "collective_times"
REGIONS = "regions"
DDP_STATS = "ddp_stats"
GPU_SAMPLES = "gpu_samples"
HOST_SAMPLES = "host_samples"

RANK_TABLES = (STEPS, COLLECTIVES, COLLECTIVE_TIMES, REGIONS, DDP_STATS)
NODE_TABLES = (GPU_SAMPLES, HOST_SAMPLES)

RANK_INFO = "rank_info.json"
STATUS = "status.json"
# A status.json written when the rank's code ended, before gpudiag's own finishing (trace
# export, tables), carries STATUS_FINISHING true; the final one replaces it. Left in place,
# the rank ended (killed, crashed) while it finished: ENDED_WHILE_FINISHING says so.
STATUS_FINISHING = "finishing"
ENDED_WHILE_FINISHING = (
    "the rank ended while gpudiag was writing its record (trace, tables, summary): "
    "they may be incomplete"
)
SUMMARY = "summary.json"
STACKS = "stacks.txt"
BENCH = "bench.json"  # gpudiag bench: the comparison table, in the bench folder and each run
INFLIGHT = "inflight.json"  # in-flight collectives + FR dump, written on a hang request
HANG_REQUEST = "hang_request"  # control file: the watchdog asks a rank for inflight.json
# Collectives this rank entered over LIVE_INFLIGHT_AGE_S ago and has not left, rewritten
# by the rank's background thread at most every second and only when that set changes
# (so a healthy job writes it about once): what `gpudiag watch` shows as stuck.
LIVE_INFLIGHT = "inflight_live.json"
LAST_CALL = "last_call.json"
LAST_CALL_BYTES = 1024  # one fixed-size slot, rewritten in place at every call
LIVE_INFLIGHT_AGE_S = 1.0

# The run's status (manifest ``status``), the one list. ``running`` is what the launcher
# writes at start; ``launcher_lost`` is never written: readers report it for a run still
# marked running whose launcher is gone (see :func:`run_status`).
RUN_STATUSES = ("running", "ok", "failed", "interrupted", "hang", "launcher_lost")
RANK_STATUSES = ("ok", "failed", "interrupted", "hang")  # status.json and summary.json ``status``
# The statuses that mean a rank (or the run) failed by itself: an exception in the script,
# a non-zero exit, or a rank that died without writing status.json (the launcher marks
# the run ``failed``). ``interrupted`` (a signal from outside: Ctrl-C, SIGTERM, a kill
# after a hang) and ``hang`` (its own finding, from hang_report.json) are not failures of
# a rank; ``launcher_lost`` says nothing about the ranks.
FAILED_STATUSES = frozenset({"failed"})


def is_failed(status: object) -> bool:
    """Whether a manifest, status.json or summary.json ``status`` value means failed."""
    return isinstance(status, str) and status.strip().lower() in FAILED_STATUSES


# Errors a rank gets when a peer went away: consequences, not causes.
PEER_ERROR_PATTERNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "remote process exited",
    "remote worker crash",
    "socket timeout",
    "econnreset",
    "communicator was aborted",
    "gloo connectfullmesh failed",
    "recv failed",
    "send failed",
    "read error",
    "write error",
)


def is_peer_error(status: Mapping[str, object]) -> bool:
    """Whether a status.json (or manifest ``failure``) says the rank failed because a
    peer went away (its collective's connection closed), not by itself."""
    text = f"{status.get('exc_type') or ''} {status.get('message') or ''}".lower()
    return any(p in text for p in PEER_ERROR_PATTERNS)


# Errors a rank gets when a collective waited longer than the process group's timeout
# (gloo, NCCL's watchdog, monitored_barrier): a consequence when a peer never arrived.
COLLECTIVE_TIMEOUT_PATTERNS = (
    "timed out waiting",
    "watchdog caught collective operation timeout",
    "before timing out",
    "failed to pass monitoredbarrier",
)


def is_collective_timeout(status: Mapping[str, object]) -> bool:
    """Whether a status.json says the rank's collective hit its process group's timeout."""
    text = f"{status.get('message') or ''}".lower()
    return any(p in text for p in COLLECTIVE_TIMEOUT_PATTERNS)


# The launcher touches its manifest every LAUNCHER_HEARTBEAT_S while the job runs.
# A reader on another host (where the pid cannot be checked) takes a manifest that still
# says running and has not been touched for LAUNCHER_STALE_S as a lost launcher.
LAUNCHER_HEARTBEAT_S = 5.0
LAUNCHER_STALE_S = 60.0
RESERVE = ".gpudiag_reserve"  # space kept for the last writes (see reserve_space)

_RANK_DIR_RE = re.compile(r"^rank(\d+)$")
_NODE_DIR_RE = re.compile(r"^node(\d+)$")
_NODE_MANIFEST_RE = re.compile(r"^manifest\.node(\d+)\.json$")


# --------------------------------------------------------------------------- paths


def rank_dir(run: str | os.PathLike[str], rank: int) -> Path:
    return Path(run) / f"rank{rank}"


def node_dir(run: str | os.PathLike[str], node: int) -> Path:
    return Path(run) / f"node{node}"


def table_path(directory: str | os.PathLike[str], table: str) -> Path:
    return Path(directory) / f"{table}.jsonl"


def trace_path(run: str | os.PathLike[str], rank: int) -> Path:
    """Named so TensorBoard's profiler plugin (``<worker>.pt.trace.json.gz``), HTA and
    Perfetto open it unchanged."""
    return Path(run) / TRACES_DIR / f"rank{rank}.pt.trace.json.gz"


def manifest_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    if node == 0:
        return Path(run) / MANIFEST
    return Path(run) / f"manifest.node{node}.json"


def hang_report_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    """Each node's hang watchdog writes its own report (node 0: hang_report.json)."""
    if node == 0:
        return Path(run) / HANG_REPORT
    return Path(run) / f"hang_report.node{node}.json"


_NODE_HANG_REPORT_RE = re.compile(r"hang_report\.node([1-9]\d{0,5})\.json")


def hang_report_paths(run: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(node, path) of every hang report in a run directory, node 0 first."""
    run = Path(run)
    found = []
    for name in list_dir(run) or ():
        match = _NODE_HANG_REPORT_RE.fullmatch(name)
        node = 0 if name == HANG_REPORT else int(match.group(1)) if match else None
        if node is not None and not is_dir(run / name):  # the reader says what else it is
            found.append((node, run / name))
    return sorted(found)


def reserve_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    return Path(run) / (RESERVE if node == 0 else f"{RESERVE}.node{node}")


# --------------------------------------------------------------------------- writing


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def dumps_line(row: dict[str, Any]) -> str:
    text = json.dumps(row, separators=(",", ":"), default=_json_default)
    if "\\ud" in text:  # maybe a lone surrogate (a path or argument that is not UTF-8)
        text = json.dumps(fs_safe(row), separators=(",", ":"), default=_json_default)
    return text + "\n"


# Bytes of a path or argument that are not UTF-8 reach Python as U+DC80-U+DCFF
# (surrogateescape); JSON readers (orjson, pyarrow, gpudiag's own) refuse them.
_FS_ESCAPED = re.compile("[\udc80-\udcff]")


def fs_text(text: str) -> str:
    """A path or argument as valid Unicode, for run files and messages: each byte that
    is not UTF-8 becomes the four characters ``\\xNN`` (what
    ``os.fsencode(text).decode("utf-8", "backslashreplace")`` gives); any other lone
    surrogate becomes U+FFFD. Text that is valid already is returned as it is."""
    if _LONE_SURROGATE.search(text) is None:
        return text
    text = _FS_ESCAPED.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)
    return _LONE_SURROGATE.sub("\ufffd", text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# and the bidirectional overrides and isolates, which reorder what a terminal shows
_CONTROL_OR_BIDI = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def one_line(text: str) -> str:
    """``text`` (a message naming a path) on one line: :func:`fs_text`, and each control
    character (a newline in a directory name...) written as its escape (``\\n``,
    ``\\x1b``), so a warning is one line whatever the path holds."""
    text = fs_text(text)
    if _CONTROL_OR_BIDI.search(text) is None:
        return text
    return _CONTROL_OR_BIDI.sub(lambda m: repr(m.group())[1:-1], text)


def has_control_chars(text: str) -> bool:
    """True when ``text`` holds a newline or another control character."""
    return _CONTROL.search(text) is not None


def without_control_chars(text: str) -> str:
    """``text`` with each newline or other control character made ``_``."""
    return _CONTROL.sub("_", text)


def fs_safe(value: Any) -> Any:
    """``value`` with :func:`fs_text` applied to every string, key and path in it."""
    if isinstance(value, str):
        return fs_text(value)
    if isinstance(value, Path):
        return fs_text(str(value))
    if isinstance(value, (list, tuple)):
        return [fs_safe(v) for v in value]
    if isinstance(value, dict):
        return {fs_safe(k): fs_safe(v) for k, v in value.items()}
    return value


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


def read_last_call(
    run: str | os.PathLike[str], rank: int, warnings: list[str] | None = None
) -> dict[str, Any] | None:
    """The user collective ``rank`` entered last (op, pg_name, seq, bytes, callsite):
    None when the rank never entered one (no file), or, with one warning naming the
    file, when it cannot be read."""
    path = rank_dir(run, rank) / LAST_CALL
    st = path_stat(path) if lexists(path) else None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return None  # the slot its writer creates at start: the rank entered no call
    if not lexists(path):
        return None
    return read_object(path, "call", warnings)


def open_rank_table(run: str | os.PathLike[str], rank: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(rank_dir(run, rank), table))


def open_node_table(run: str | os.PathLike[str], node: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(node_dir(run, node), table))


def write_rank_json(
    run: str | os.PathLike[str], rank: int, name: str, obj: Any, reserve: Path | None = None
) -> None:
    write_json_atomic(rank_dir(run, rank) / name, obj, reserve)


# --------------------------------------------------------------------------- reading


class RunFormatError(ValueError):
    """A run directory (or one of its files) that cannot be read. The message is one
    line naming the file and the problem."""


class BadInput(str):
    """A warning saying that an input file was unusable, or partly so (skipped lines,
    fields of the wrong type). Still a one-line string naming the file; `gpudiag
    analyze` exits 2 when any is reported (docs/reliability.md)."""


def bad_input(warnings: list[str] | None, message: str) -> None:
    if warnings is not None:
        warnings.append(BadInput(message))


# --------------------------------------------------------------------------- safe reading
#
# Every file a reader takes from a run directory or a trace set (gpudiag.analysis.ingest
# reads traces through these too) is opened by open_regular: without blocking
# (O_NONBLOCK, so a FIFO or a device in a file's place cannot hang the open) and read
# only when it is a regular file, so /dev/zero symlinked in a file's place is refused,
# not read until memory runs out. Each kind of file is read up to its limit (below), its
# text decoded so that what is not Unicode becomes U+FFFD, and every directory is listed
# by list_dir. Whatever is on disk, the result is the content or one warning line
# ``<path>: <problem>`` (read_problem), never an exception.

MAX_DOC_BYTES = 16 << 20  # a JSON document: manifest, status, rank_info, summary, lint...
MAX_TEXT_BYTES = 16 << 20  # a text file (stacks.txt)
MAX_LINE_BYTES = 1 << 20  # one row of a table; a longer line is skipped
# One table (JSON Lines) in all: the rows past it are not read. GPUDIAG_MAX_TABLE_BYTES
# overrides it; traces have their own limit (ingest.DEFAULT_MAX_TRACE_BYTES).
DEFAULT_MAX_TABLE_BYTES = 2 << 30


def max_table_bytes() -> int:
    raw = os.environ.get("GPUDIAG_MAX_TABLE_BYTES")
    try:
        return max(1, int(raw)) if raw else DEFAULT_MAX_TABLE_BYTES
    except ValueError:
        return DEFAULT_MAX_TABLE_BYTES


class UnusableFile(OSError):
    """A file refused before its content is read: not a regular file, or above its
    kind's limit. ``strerror`` is the reason, as a warning line shows it."""


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path: str | os.PathLike[str], mode: int) -> UnusableFile:
    kind = next((what for test, what in _FILE_KINDS if test(mode)), "something else")
    return UnusableFile(errno.EINVAL, f"{kind}, not a regular file; refused", str(path))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` (symlinks followed) opened for reading in binary when it is a regular
    file. Never blocks: a FIFO, a device, a socket or a directory raises
    :class:`UnusableFile` without a byte read; other problems raise their OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except ValueError as exc:  # an embedded NUL byte
        raise UnusableFile(errno.EINVAL, f"not a usable path ({exc})", str(path)) from None
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.EOPNOTSUPP):
            raise
        try:  # a socket (or a device without a driver) cannot be opened at all
            mode = os.stat(path).st_mode
        except OSError:
            raise exc from None
        raise _not_regular(path, mode) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _what_is(path: str | os.PathLike[str]) -> str:
    """What is at ``path``, in words: "a regular file", "a FIFO", "a dangling symlink"..."""
    st = path_stat(path)
    if st is None:
        return "a dangling symlink" if os.path.islink(path) else "unreachable"
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    return next((what for test, what in _FILE_KINDS if test(st.st_mode)), "something else")


def _size_text(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def too_big(path: str | os.PathLike[str], limit: int, what: str) -> UnusableFile:
    return UnusableFile(
        errno.EFBIG, f"larger than the {_size_text(limit)} limit of {what}; refused", str(path)
    )


def read_limited(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`); :class:`UnusableFile`
    naming ``what`` when it holds more than ``limit`` (never reads past it)."""
    with open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise too_big(path, limit, what)
        data = fh.read(limit + 1)
    if len(data) > limit:  # it grew, or its size is not what it holds
        raise too_big(path, limit, what)
    return data


def read_problem(exc: BaseException) -> str:
    """What a warning line says after ``<path>: `` for an error reading that path."""
    if isinstance(exc, UnusableFile):
        return str(exc.strerror)
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read ({exc.strerror})"
    return f"cannot read ({_short(exc)})"


def path_stat(path: str | os.PathLike[str]) -> os.stat_result | None:
    """``os.stat`` (symlinks followed), None when it fails for any reason."""
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def is_dir(path: str | os.PathLike[str]) -> bool:
    """``Path.is_dir`` that never raises (a directory that cannot be reached is not one)."""
    st = path_stat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    st = path_stat(path)
    return st is not None and stat.S_ISREG(st.st_mode)


def lexists(path: str | os.PathLike[str]) -> bool:
    """Whether something (a dangling symlink too) is at ``path``; a path that cannot be
    looked at (a directory without permission on the way) counts as there, so that
    reading it reports why."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    except OSError:
        return True
    return True


def list_dir(path: str | os.PathLike[str], warnings: list[str] | None = None) -> list[str] | None:
    """The sorted names in the directory ``path``; None, with one warning, when it
    cannot be listed (permission denied, not a directory, gone)."""
    try:
        return sorted(os.listdir(path))
    except (OSError, ValueError) as exc:
        bad_input(warnings, f"{path}: {read_problem(exc)}")
        return None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# where JSON text can hold a lone surrogate: a \uD800-\uDFFF escape, or its UTF-8 bytes
# (which json.loads decodes with surrogatepass)
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _unicode_safe(value: Any, fixed: list[int]) -> Any:
    """``value`` (parsed JSON) with every lone surrogate in its strings and keys replaced
    by U+FFFD (pandas, pyarrow, orjson and a UTF-8 terminal all refuse them);
    ``fixed[0]`` counts the strings changed."""
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value) is None:
            return value
        fixed[0] += 1
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_unicode_safe(v, fixed) for v in value]
    if isinstance(value, dict):
        return {_unicode_safe(k, fixed): _unicode_safe(v, fixed) for k, v in value.items()}
    return value


def loads_json(data: bytes) -> tuple[Any, int]:
    """JSON text (bytes) parsed, with lone surrogates replaced by U+FFFD; and the number
    of strings so changed. Raises ValueError (UnicodeDecodeError for bytes that are not
    UTF-8) or RecursionError as json.loads does."""
    value = json.loads(data)
    if _SURROGATE_HINT.search(data) is None:
        return value, 0
    fixed = [0]
    return _unicode_safe(value, fixed), fixed[0]


def _not_unicode(path: Path | str, fixed: int, where: str = "") -> str:
    return (
        f"{path}: {fixed} string(s){where} with a lone surrogate (not valid Unicode); "
        "replaced with U+FFFD"
    )


def read_text(
    path: str | os.PathLike[str], warnings: list[str] | None = None, max_bytes: int = MAX_TEXT_BYTES
) -> str | None:
    """A text file (UTF-8; what is not becomes U+FFFD), or None, with one warning, when
    it cannot be read or is above ``max_bytes``."""
    try:
        data = read_limited(path, max_bytes, "a text file")
    except OSError as exc:
        bad_input(warnings, f"{path}: {read_problem(exc)}")
        return None
    return data.decode("utf-8", errors="replace")


MAX_DEPTH = 32  # nesting a run file never needs; deeper is refused (RecursionError later)
_INT64 = (-(2**63), 2**63 - 1)


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _is_int(v: Any) -> bool:
    return type(v) is int and _INT64[0] <= v <= _INT64[1]


def _is_num(v: Any) -> bool:
    return (type(v) is int and _INT64[0] <= v <= _INT64[1]) or (
        type(v) is float and v == v and abs(v) != float("inf")
    )


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


# what each field of a run file must be (None is always allowed: the field is unknown)
_CHECKS: dict[str, tuple[Any, str]] = {
    "int": (_is_int, "an integer"),
    "num": (_is_num, "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "key": (lambda v: isinstance(v, str) or _is_int(v), "a string or an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "ints": (_is_int_list, "a list of integers"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "pid": (lambda v: type(v) is int and 0 < v < 2**31, "a process id"),
}

SCHEMAS: dict[str, dict[str, str]] = {
    STEPS: {
        "step": "int",
        "start_ns": "int",
        "end_ns": "int",
        "data_ns": "num",
        "optimizer_ns": "num",
        "cpu_ns": "num",
        "runq_ns": "num",
        "threads_runq_ns": "num",
        "source": "str",
    },
    COLLECTIVES: {
        "pg_name": "key",
        "pg_desc": "str",
        "pg_size": "int",
        "pg_ranks": "ints",
        "seq": "int",
        "op": "str",
        "in_bytes": "num",
        "out_bytes": "num",
        "dtype": "str",
        "in_sizes": "list",
        "out_sizes": "list",
        "enqueue_ns": "int",
        "start_ns": "int",
        "end_ns": "int",
        "step": "int",
        "record_id": "int",
        "source": "str",
    },
    COLLECTIVE_TIMES: {
        "pg_name": "key",
        "seq": "int",
        "start_ns": "int",
        "end_ns": "int",
        "source": "str",
    },
    REGIONS: {"name": "str", "start_ns": "int", "end_ns": "int", "step": "int"},
    DDP_STATS: {"step": "int"},
    GPU_SAMPLES: {
        "t_ns": "int",
        "gpu": "int",
        "uuid": "str",
        **{
            k: "num"
            for k in (
                "util_gpu",
                "util_mem",
                "mem_used",
                "mem_total",
                "power_w",
                "sm_clock_mhz",
                "throttle_reasons",
                "pcie_tx_kbs",
                "pcie_rx_kbs",
                "nvlink_tx_kbs",
                "nvlink_rx_kbs",
                "temp_c",
            )
        },
    },
    HOST_SAMPLES: {
        "t_ns": "int",
        **{
            k: "num"
            for k in ("cpu_percent", "mem_used", "mem_total", "proc_cpu_percent", "proc_rss")
        },
    },
    MANIFEST: {
        "format_version": "int",
        "world_size": "int",
        "status": "str",
        "exit_code": "int",
        "failure": "dict",
        "failed_ranks": "ints",
        "backend": "str",
        "script": "str",
        "module": "str",
        "argv": "list",
        "synthetic": "bool",
        "launcher": "dict",
        "incomplete": "list",
        "traced_ranks": "ints",
        "untraced_ranks": "ints",
        "init_method": "str",
    },
    STATUS: {
        "rank": "int",
        "status": "str",
        "state": "str",
        "exit_code": "int",
        "exc_type": "str",
        "message": "str",
        "error": "str",
        "traceback": "str",
        "steps_completed": "int",
        "start_ns": "int",
        "end_ns": "int",
        "profile_error": "str",
        STATUS_FINISHING: "bool",
    },
    RANK_INFO: {
        "rank": "int",
        "local_rank": "int",
        "world_size": "int",
        "node_rank": "int",
        "hostname": "str",
        "pid": "int",
        "backend": "str",
        "device": "str",
        "start_ns": "int",
        "rank_source": "str",
        "started_by": "str",
        "init_method": "str",
        "parent_pid": "int",
    },
    SUMMARY: {"format_version": "int", "rank": "int", "status": "str", "steps": "dict"},
    HANG_REPORT: {
        "detected_after_s": "num",
        "ranks": "dict",
        "stuck_ranks": "ints",
        "ranks_not_in_collective": "ints",
        "desync": "dict",
        "verdict": "str",
    },
    "launcher": {"pid": "pid", "hostname": "str", "start_time": "num", "heartbeat_s": "num"},
    "failure": {
        "rank": "int",
        "exit_code": "int",
        "exc_type": "str",
        "message": "str",
        "traceback": "str",
    },
    "hang_rank": {"last_step": "int", "top_frame": "str", "inflight": "list"},
    "inflight": {"seq": "int", "op": "str", "pg_name": "key", "bytes": "num", "callsite": "str"},
    "desync": {"pg_name": "key", "seq": "int", "calls": "dict", "verdict": "str"},
    "call": {"op": "str", "callsite": "str", "seq": "int", "pg_name": "key"},
}


def _bad_fields(row: dict, schema: str) -> list[str]:
    problems = []
    for key, kind in SCHEMAS[schema].items():
        value = row.get(key)
        if value is not None:
            check, what = _CHECKS[kind]
            if not check(value):
                problems.append(f"{key!r} must be {what}")
    return problems


def check_fields(
    obj: dict, schema: str, path: Path | str, warnings: list[str] | None
) -> dict[str, Any]:
    """``obj`` without the fields of the wrong type, one warning naming the file."""
    problems = _bad_fields(obj, schema)
    if not problems:
        return obj
    bad_input(warnings, f"{path}: ignored field(s) of the wrong type: {'; '.join(problems)}")
    names = {p.split("'")[1] for p in problems}
    return {k: v for k, v in obj.items() if k not in names}


def _int_keyed(
    value: Any, schema: str, path: Path | str, warnings: list[str] | None, what: str
) -> dict[str, dict]:
    """A {rank: object} mapping (JSON keys are strings): non-integer keys and
    non-object values are dropped with a warning."""
    out: dict[str, dict] = {}
    dropped = []
    for key, item in (value or {}).items():
        if isinstance(item, dict) and re.fullmatch(r"\d{1,9}", str(key)):
            out[str(int(key))] = check_fields(item, schema, f"{path} ({what} {key})", warnings)
        else:
            dropped.append(str(key)[:20])
    if dropped:
        bad_input(warnings, f"{path}: ignored {what} entries with a bad rank key: {dropped[:5]}")
    return out


def check_hang_report(report: dict, path: Path, warnings: list[str] | None) -> dict[str, Any]:
    report = check_fields(report, HANG_REPORT, path, warnings)
    if isinstance(report.get("ranks"), dict):
        ranks = _int_keyed(report["ranks"], "hang_rank", path, warnings, "ranks")
        for key, state in ranks.items():
            if isinstance(state.get("inflight"), list):
                calls = [c for c in state["inflight"] if isinstance(c, dict)]
                state["inflight"] = [
                    check_fields(c, "inflight", f"{path} (rank {key} inflight)", warnings)
                    for c in calls
                ]
        report["ranks"] = ranks
    if isinstance(report.get("desync"), dict):
        desync = check_fields(report["desync"], "desync", f"{path} (desync)", warnings)
        if isinstance(desync.get("calls"), dict):
            desync["calls"] = _int_keyed(desync["calls"], "call", path, warnings, "desync calls")
        report["desync"] = desync
    return report


def read_hang_reports(run: Path, warnings: list[str] | None) -> dict[str, Any] | None:
    """Every node's hang report of a run directory, merged (None when there is none)."""
    reports = []
    for node, path in hang_report_paths(run):
        report = read_object(path, HANG_REPORT, warnings)
        if report is not None:
            reports.append((node, report))
    return merge_hang_reports(reports)


def merge_hang_reports(reports: list[tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """One report for the job from each node's (a node's watchdog sees only its own ranks,
    so only the report of the node whose rank never arrived can name it). The verdict
    is the one that names a rank outside the collective, or a desync, else node 0's;
    ``node_verdicts`` keeps each node's."""
    if len(reports) <= 1:
        return reports[0][1] if reports else None
    reports = sorted(reports, key=lambda item: item[0])
    merged: dict[str, Any] = {"ranks": {}, "nodes": [node for node, _ in reports]}
    for _, report in reports:
        if isinstance(report.get("ranks"), dict):
            merged["ranks"].update(report["ranks"])
    for key in ("stuck_ranks", "ranks_not_in_collective", "working_ranks"):
        merged[key] = sorted(
            {r for _, rep in reports for r in (rep.get(key) or []) if isinstance(r, int)}
        )
    for key in ("detected_after_s", "t_ns"):
        values = [rep[key] for _, rep in reports if isinstance(rep.get(key), (int, float))]
        if values:
            merged[key] = min(values)
    merged["hang"] = any(rep.get("hang") is True for _, rep in reports)
    merged["desync"] = next(
        (rep["desync"] for _, rep in reports if isinstance(rep.get("desync"), dict)), None
    )
    telling = [
        rep
        for _, rep in reports
        if rep.get("ranks_not_in_collective") or isinstance(rep.get("desync"), dict)
    ]
    chosen = telling[0] if telling else reports[0][1]
    if isinstance(chosen.get("verdict"), str):
        merged["verdict"] = chosen["verdict"]
    merged["node_verdicts"] = {
        str(node): rep["verdict"] for node, rep in reports if isinstance(rep.get("verdict"), str)
    }
    return merged


def read_object(
    path: str | os.PathLike[str], schema: str, warnings: list[str] | None = None
) -> dict[str, Any] | None:
    """A run file holding one JSON object, with its known fields type-checked: None
    (one warning) when missing, unreadable, not an object or absurdly nested."""
    path = Path(path)
    obj = read_json(path, warnings)
    if obj is None:
        return None
    if not isinstance(obj, dict):
        bad_input(warnings, f"{path}: not a JSON object; ignored")
        return None
    if _too_deep(obj):
        bad_input(warnings, f"{path}: nested deeper than {MAX_DEPTH} levels; ignored")
        return None
    obj = check_fields(obj, schema, path, warnings)
    for key in ("failure", "launcher"):
        if schema == MANIFEST and isinstance(obj.get(key), dict):
            obj[key] = check_fields(obj[key], key, f"{path} ({key})", warnings)
    if schema == MANIFEST and isinstance(obj.get("failure"), dict):
        obj["failure"] = _failure_in_range(obj["failure"], obj.get("world_size"), path, warnings)
    if schema == HANG_REPORT:
        obj = check_hang_report(obj, path, warnings)
    return obj


def _failure_in_range(
    failure: dict[str, Any], world_size: object, path: Path, warnings: list[str] | None
) -> dict[str, Any]:
    """A manifest ``failure`` whose rank is no rank of the job (-1, 99 in a world of 3)
    or whose ``consequences`` is not a list: that field is dropped, with one warning
    (eighth probe: "Rank 99 failed first" from a damaged manifest)."""
    rank = failure.get("rank")
    world = world_size if isinstance(world_size, int) and not isinstance(world_size, bool) else None
    if isinstance(rank, int) and (rank < 0 or (world is not None and rank >= world)):
        where = f" of {world}" if world is not None else ""
        bad_input(
            warnings, f"{path} (failure): rank {rank} is no rank of the world{where}; ignored"
        )
        failure = {**failure, "rank": None}
    consequences = failure.get("consequences")
    if consequences is not None and not isinstance(consequences, list):
        bad_input(warnings, f"{path} (failure): consequences is not a list; ignored")
        failure = {**failure, "consequences": None}
    return failure


class _Lines:
    """The lines of a binary file (without their newline), read a block at a time:
    (line number, line, whether a newline ended it, whether it may hold a lone
    surrogate). A line longer than MAX_LINE_BYTES is skipped (``long_lines`` counts
    them), and nothing past ``limit`` bytes is read (``over``: the file goes on; the
    line the limit cuts is dropped)."""

    BLOCK = 1 << 20

    def __init__(self, fh: BinaryIO, limit: int) -> None:
        self.fh = fh
        self.limit = limit
        self.over = False
        self.long_lines = 0
        self.first_long = 0
        self._lineno = 0

    def _long(self) -> None:
        self.long_lines += 1
        self.first_long = self.first_long or self._lineno

    def __iter__(self) -> Iterator[tuple[int, bytes, bool, bool]]:
        carry = b""  # the start of a line whose end is not read yet
        skipping = False  # inside a line longer than MAX_LINE_BYTES
        total = 0
        while True:
            room = self.limit - total
            block = self.fh.read(min(self.BLOCK, room + 1))
            total += len(block)
            if len(block) > room:
                self.over = True
                block = block[:room]
            pieces = block.split(b"\n")
            tail = pieces.pop()  # after the block's last newline
            hinted = _SURROGATE_HINT.search(block) is not None
            for i, piece in enumerate(pieces):
                if i == 0:
                    piece, carry = carry + piece, b""
                    if skipping:  # the end of a long line
                        skipping = False
                        continue
                    hint = _SURROGATE_HINT.search(piece) is not None  # it may span blocks
                else:
                    hint = hinted
                self._lineno += 1
                if len(piece) > MAX_LINE_BYTES:
                    self._long()
                    continue
                yield self._lineno, piece, True, hint
            if not skipping:
                carry = carry + tail if not pieces else tail
                if len(carry) > MAX_LINE_BYTES:
                    self._lineno += 1
                    self._long()
                    carry, skipping = b"", True
            if self.over or not block:
                break
        if carry and not self.over:  # the last line, without a newline
            self._lineno += 1
            yield self._lineno, carry, False, _SURROGATE_HINT.search(carry) is not None


def iter_jsonl(
    path: str | os.PathLike[str],
    warnings: list[str] | None = None,
    schema: str | None = None,
    max_bytes: int | None = None,
) -> Iterator[dict]:
    """Rows of a JSON Lines file, read a row at a time: a line longer than
    MAX_LINE_BYTES is skipped, and nothing past ``max_bytes`` (default
    :func:`max_table_bytes`) is read. A torn or malformed line, and with ``schema`` a row
    with a field of the wrong type (SCHEMAS), is skipped with one warning naming the
    file and the first such line; lone surrogates in strings become U+FFFD (one
    warning). A file that is not a regular file is one warning. It never raises for
    what is on disk."""
    path = Path(path)
    limit = max_table_bytes() if max_bytes is None else max_bytes
    try:
        fh = open_regular(path)
    except OSError as exc:
        bad_input(warnings, f"{path}: {read_problem(exc)}")
        return
    bad = 0
    first_bad = 0
    torn_tail = False  # the one bad line is the unterminated last one: a write cut short
    mistyped = 0
    first_mistyped = ""
    fixed = 0
    first_fixed = 0
    lines = _Lines(fh, limit)
    with fh:
        try:
            for lineno, raw, complete, hinted in lines:
                if not raw.strip():
                    continue
                try:
                    if hinted:
                        row, changed = loads_json(raw)
                    else:
                        row, changed = json.loads(raw), 0
                except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                    row, changed = None, 0
                if not isinstance(row, dict) or _too_deep(row):
                    bad += 1
                    first_bad = first_bad or lineno
                    torn_tail = not complete
                    continue
                if changed:
                    fixed += changed
                    first_fixed = first_fixed or lineno
                problems = _bad_fields(row, schema) if schema else []
                if problems:
                    mistyped += 1
                    first_mistyped = first_mistyped or f"line {lineno}: {problems[0]}"
                    continue
                yield row
        except OSError as exc:
            bad_input(warnings, f"{path}: {read_problem(exc)}")
    long_lines, first_long = lines.long_lines, lines.first_long
    if lines.over:
        bad_input(
            warnings,
            f"{path}: larger than the {_size_text(limit)} limit of a table; rows past it "
            "not read (GPUDIAG_MAX_TABLE_BYTES raises it)",
        )
    if long_lines:
        bad_input(
            warnings,
            f"{path}: skipped {long_lines} line(s) longer than {_size_text(MAX_LINE_BYTES)}, "
            f"first at line {first_long}",
        )
    if bad == 1 and torn_tail:
        # A rank killed mid-write leaves its last row unfinished: expected, not bad input.
        if warnings is not None:
            warnings.append(
                f"{path}: ignored its unfinished last line (the rank stopped mid-write)"
            )
    elif bad:
        bad_input(
            warnings,
            f"{path}: skipped {bad} malformed line(s), first at line {first_bad} "
            "(torn write from a crash?)",
        )
    if fixed:
        bad_input(warnings, _not_unicode(path, fixed, f" (first at line {first_fixed})"))
    if mistyped:
        bad_input(
            warnings,
            f"{path}: skipped {mistyped} row(s) with a field of the wrong type "
            f"(first at {first_mistyped})",
        )


def final_status_written(run: str | os.PathLike[str], rank: int) -> bool:
    """The rank wrote its final status.json (not the early one of :data:`STATUS_FINISHING`)."""
    status = read_json(rank_dir(run, rank) / STATUS)
    return isinstance(status, dict) and not status.get(STATUS_FINISHING)


def read_json(
    path: str | os.PathLike[str],
    warnings: list[str] | None = None,
    max_bytes: int = MAX_DOC_BYTES,
) -> Any | None:
    """A small JSON document, or None: silently when missing, with one warning when
    it cannot be read, is not a regular file, is above ``max_bytes`` or is not JSON.
    Lone surrogates in its strings become U+FFFD (one warning)."""
    path = Path(path)
    if not lexists(path):
        return None
    try:
        data = read_limited(path, max_bytes, "a JSON document")
    except OSError as exc:
        bad_input(warnings, f"{path}: {read_problem(exc)}")
        return None
    try:
        obj, fixed = loads_json(data)
    except ValueError as exc:
        bad_input(warnings, f"{path}: not valid JSON ({_short(exc)})")
        return None
    except RecursionError:
        bad_input(warnings, f"{path}: nested too deeply to read; ignored")
        return None
    if fixed:
        bad_input(warnings, _not_unicode(path, fixed))
    return obj


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__


def _process_start_time(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # psutil missing, no such process, access denied
        return None


def launcher_gone(manifest: dict[str, Any], manifest_file: str | os.PathLike[str]) -> str | None:
    """Why the launcher of a run still marked running is known to be gone, or None
    (alive, or nothing to tell). Same host: its pid no longer exists, or belongs to a
    process started later. Another host: the manifest heartbeat is stale."""
    launcher = manifest.get("launcher")
    if launcher is None:
        return None  # no record of the launcher (written before it was recorded)
    bad = launcher_pid_problem(launcher)
    if bad:  # a record no launcher writes: nothing can show it alive, so it is not
        return f"{bad}; taken as not running"
    assert isinstance(launcher, dict)
    pid = launcher["pid"]
    host = launcher.get("hostname")
    if host == socket.gethostname():
        started = launcher.get("start_time")
        actual = _process_start_time(pid)
        if actual is None and not _pid_exists(pid):
            return f"launcher pid {pid} on {host} is gone"
        if actual is not None and isinstance(started, (int, float)) and abs(actual - started) > 2:
            return f"launcher pid {pid} on {host} is gone (the pid now belongs to another process)"
        return None
    beat = launcher.get("heartbeat_s")  # a period over LAUNCHER_STALE_S (1e300) is not believed
    period = min(float(beat), LAUNCHER_STALE_S) if isinstance(beat, (int, float)) else 0.0
    period = period if _is_num(beat) and period > 0 else 0.0
    stale = max(LAUNCHER_STALE_S, 10 * period)
    try:
        age = time.time() - os.stat(manifest_file).st_mtime
    except OSError:
        return None
    if age > stale:
        return f"launcher on {host or 'another host'} has not touched the manifest for {age:.0f} s"
    return None


def launcher_pid_problem(launcher: object) -> str | None:
    """What is wrong with a manifest's launcher record, or None. Every launcher writes its
    pid, an int the kernel gives (1.._MAX_PID): a string ("123"), a float (1e300), a bool,
    a missing pid or a record that is not an object cannot be a running launcher."""
    if not isinstance(launcher, dict):
        return f"launcher record {_short_repr(launcher)} is not an object"
    if "pid" not in launcher:
        return "launcher record has no pid"
    pid = launcher["pid"]
    if type(pid) is int and 0 < pid <= _MAX_PID:
        return None
    return f"launcher pid {_short_repr(pid)} is not a process id (an integer 1..{_MAX_PID})"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _pid_exists(pid: int) -> bool:
    if pid <= 0 or pid > _MAX_PID:  # a pid no kernel gives (a bad manifest): not running
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


_MAX_PID = 2**22  # Linux's pid_max limit (PID_MAX_LIMIT)


def run_status(manifest: dict[str, Any], manifest_file: str | os.PathLike[str]) -> str | None:
    """The run's status as a reader should see it: the manifest's, except that a run
    still marked running whose launcher is gone is ``launcher_lost``."""
    status = manifest.get("status")
    if status == "running" and launcher_gone(manifest, manifest_file):
        return "launcher_lost"
    return status if isinstance(status, str) else None


def worst_status(statuses: Iterable[Any]) -> str | None:
    """A multi-node job's status from its nodes' (a job whose one node failed failed)."""
    worst = _worst_status(statuses)
    return worst if isinstance(worst, str) else None


def node_run_statuses(run: str | os.PathLike[str]) -> dict[int, str | None]:
    """:func:`run_status` of each node's manifest in ``run`` (manifest.json and every
    manifest.node<K>.json, or those of each per-node directory when ``run`` is their
    parent, see :func:`node_parts`), by node rank; {} without a manifest."""
    run = Path(run)
    found: dict[int, str | None] = {}
    for part in node_parts(run):
        found.update(node_run_statuses(part))
    if found:
        return found
    paths = [run / n for n in list_dir(run) or () if n == MANIFEST or _NODE_MANIFEST_RE.match(n)]
    for path in paths:
        manifest = read_json(path)
        if isinstance(manifest, dict):
            m = _NODE_MANIFEST_RE.match(path.name)
            node = int(m.group(1)) if m else manifest_node(manifest)
            found[node] = run_status(manifest, path)
    return found


def _reader_notes(manifest: dict[str, Any], manifest_file: Path, warnings: list[str]) -> None:
    """Adjust the manifest to what a reader should see (launcher_lost) and warn about
    runs whose record is incomplete."""
    if manifest.get("status") == "running":
        why = launcher_gone(manifest, manifest_file)
        if why:
            manifest["recorded_status"] = "running"
            manifest["status"] = "launcher_lost"
            warnings.append(
                f"{manifest_file}: launcher_lost: the run never finished ({why}); its "
                "tables hold what the ranks wrote before"
            )
    incomplete = manifest.get("incomplete")
    if isinstance(incomplete, list) and incomplete:
        shown = "; ".join(str(x) for x in incomplete[:3])
        more = f" (+{len(incomplete) - 3} more)" if len(incomplete) > 3 else ""
        warnings.append(f"{manifest_file}: run incomplete: {shown}{more}")


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True for a directory written by ``gpudiag trace`` (has a manifest or rank dirs)."""
    path = Path(path)
    names = list_dir(path) if is_dir(path) else None
    if names is None:
        return False
    if MANIFEST in names and not is_dir(path / MANIFEST):
        return True
    return any(
        (_RANK_DIR_RE.match(n) and is_dir(path / n))
        or (_NODE_MANIFEST_RE.match(n) and not is_dir(path / n))
        for n in names
    )


_RANK_TRACE_RE = re.compile(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$")


def _rank_layout(
    run: Path, names: Iterable[str], warnings: list[str] | None
) -> tuple[list[int], dict[int, Path]]:
    """The ranks of a run directory whose entries are ``names``: its rank<R>
    directories and traces/rank<R>.pt.trace.json[.gz] files; and each rank's trace
    file (:func:`trace_path`). traces/ is listed once (one warning when it cannot be)."""
    ranks = set()
    for name in names:
        m = _RANK_DIR_RE.match(name)
        if not m and name != TRACES_DIR:
            continue
        if not is_dir(run / name):
            bad_input(warnings, f"{run / name}: {_what_is(run / name)}, not a directory; ignored")
        elif m:
            ranks.add(int(m.group(1)))
    traces: dict[int, Path] = {}
    tdir = run / TRACES_DIR
    if TRACES_DIR in names and is_dir(tdir):
        for name in list_dir(tdir, warnings) or ():
            m = _RANK_TRACE_RE.match(name)
            if m:
                r = int(m.group(1))
                ranks.add(r)
                # trace_path's .gz, else the uncompressed rank<R>.pt.trace.json (read, so
                # that a bad one is a warning, not a silently missing rank)
                if not is_dir(tdir / name) and (name == trace_path(run, r).name or r not in traces):
                    traces[r] = tdir / name
    return sorted(ranks), traces


def list_ranks(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    names = list_dir(run) if is_dir(run) else None
    return _rank_layout(run, names or (), None)[0]


def list_nodes(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    names = list_dir(run) if is_dir(run) else None
    return sorted(
        int(m.group(1)) for n in names or () if (m := _NODE_DIR_RE.match(n)) and is_dir(run / n)
    )


# --------------------------------------------------------------------------- discovery
# Where runs and traces are found: `gpudiag analyze`, the dashboard and the sample runs
# all ask here.

# A profiler trace by name: Kineto's `<worker>[.<ns>].pt.trace.json[.gz]`, or any other
# `*.json[.gz]` (HTA, torchtitan, Megatron dumps). The analysis reads every such file and
# warns, naming it, when one is not a trace.
_TRACE_NAME_RE = re.compile(r"\.(?:pt\.)?trace\.json(?:\.gz)?$|\.json(?:\.gz)?$")
_KINETO_NAME_RE = re.compile(r"\.pt\.trace\.json(?:\.gz)?$")
# JSON documents of a run directory (and of `gpudiag bench`) that are never traces
RUN_FILES = frozenset({MANIFEST, LINT, HANG_REPORT, RANK_INFO, STATUS, SUMMARY, INFLIGHT, BENCH})
_TRACE_MARKERS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"')
_SNIFF_BYTES = 65536


def is_trace_name(name: str) -> bool:
    return bool(_TRACE_NAME_RE.search(name)) and not name.endswith((".jsonl", ".jsonl.gz"))


def trace_name_stem(name: str) -> str:
    """The file name without its trace suffix (``rank3.pt.trace.json.gz`` -> ``rank3``)."""
    return _TRACE_NAME_RE.sub("", name)


def _trace_files_in(directory: Path, warnings: list[str] | None = None) -> list[Path]:
    """The files named like traces in ``directory``: anything but a directory, so that
    a FIFO, a device or a dangling link named like one is refused by the reader with a
    warning rather than passed over."""
    return [
        directory / name
        for name in list_dir(directory, warnings) or ()
        if is_trace_name(name)
        and not name.startswith(".")
        and name not in RUN_FILES
        and not name.startswith(("manifest.", "hang_report."))
        and not is_dir(directory / name)
    ]


def find_traces(path: str | os.PathLike[str], warnings: list[str] | None = None) -> list[Path]:
    """Trace files under ``path``: a gpudiag run dir (its ``traces/``), a directory of
    profiler traces (searched one level deep), or a single file. Chosen by name only: a
    file named like a trace that is not one is for the reader to report. A directory
    that cannot be listed is one warning (with ``warnings``)."""
    path = Path(path)
    if not is_dir(path):
        return [path] if lexists(path) else []
    if is_run_dir(path):  # only its traces/, never its own JSON files
        tdir = path / TRACES_DIR
        return _trace_files_in(tdir, warnings) if is_dir(tdir) else []
    if is_dir(path / TRACES_DIR):
        found = _trace_files_in(path / TRACES_DIR, warnings)
        if found:
            return found
    names = list_dir(path, warnings)
    found = _trace_files_in(path) if names is not None else []
    if found:
        return found
    nested: list[Path] = []
    for name in names or ():
        if is_dir(path / name):
            nested.extend(_trace_files_in(path / name, warnings))
    return nested


def looks_like_trace(path: Path) -> bool:
    """A profiler trace by name (Kineto's, even when damaged) or, for another ``*.json``,
    by its first bytes: how a folder of runs is told apart from folders of other JSON.
    Only a regular file is one (never opened otherwise)."""
    if path.name in RUN_FILES or path.name.startswith((".", "hang_report.")):
        return False
    if not is_regular_file(path):
        return False
    if _KINETO_NAME_RE.search(path.name):
        return True
    if not _TRACE_NAME_RE.search(path.name) or path.name.endswith((".jsonl", ".jsonl.gz")):
        return False
    try:
        with open_regular(path) as raw:
            if path.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                    head = fh.read(_SNIFF_BYTES)
            else:
                head = raw.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    return any(marker in head for marker in _TRACE_MARKERS)


def holds_traces(directory: Path) -> bool:
    return any(looks_like_trace(directory / name) for name in list_dir(directory) or ())


def is_analysable(directory: Path) -> bool:
    """A gpudiag run directory, a directory holding profiler traces itself, or the
    parent of one multi-node job's per-node directories (:func:`node_parts`: read as
    one run)."""
    return is_dir(directory) and (
        is_run_dir(directory) or holds_traces(directory) or bool(node_parts(directory))
    )


def find_runs(root: str | os.PathLike[str], max_depth: int = 2) -> list[Path]:
    """Analysable directories under ``root`` (the root itself when it is one), sorted,
    looking ``max_depth`` folders deep (a root, its runs, and runs grouped one folder
    deeper such as a `gpudiag bench` output)."""
    return _runs_under(Path(root), 0, max_depth)


def _runs_under(directory: Path, depth: int, max_depth: int) -> list[Path]:
    if is_analysable(directory):
        return [directory]
    if depth >= max_depth:
        return []
    children = [
        directory / n for n in list_dir(directory) or () if n[0] != "." and is_dir(directory / n)
    ]
    return [run for child in children for run in _runs_under(child, depth + 1, max_depth)]


def sample_run_paths(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every run under the shipped sample_runs/ (or ``root``): `gpudiag analyze`'s and
    the dashboard's default."""
    from gpudiag.paths import sample_runs_dir

    return find_runs(sample_runs_dir() if root is None else root)


@dataclass
class Run:
    """Everything in a run directory, as pandas DataFrames and plain dicts.

    Rank tables carry a ``rank`` column, node tables a ``node`` column. Missing tables
    are empty DataFrames, so callers never need to special-case a partial run.
    """

    path: Path
    manifest: dict[str, Any]
    steps: Any
    collectives: Any
    regions: Any
    ddp_stats: Any
    gpu_samples: Any
    host_samples: Any
    rank_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: dict[int, dict[str, Any]] = field(default_factory=dict)
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    trace_files: dict[int, Path] = field(default_factory=dict)
    lint: LintReport | None = None
    hang_report: dict[str, Any] | None = None
    stacks: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    parts: list[Path] = field(default_factory=list)  # per-node directories merged
    # rank -> ns added to its times (its node's clock offset to node 0; applied to the
    # tables here, to its trace by the analysis)
    clock_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(
            set(self.rank_info)
            | set(self.statuses)
            | set(self.summaries)
            | set(self.trace_files)
            | (set(self.steps["rank"].unique()) if len(self.steps) else set())
        )

    @property
    def rank_nodes(self) -> dict[int, int]:
        """rank -> node rank, from each rank's rank_info.json (ranks without one are
        absent)."""
        return {
            r: n
            for r, info in self.rank_info.items()
            if isinstance(n := info.get("node_rank"), int) and not isinstance(n, bool)
        }

    @property
    def world_size(self) -> int | None:
        ws = self.manifest.get("world_size")
        if ws:
            return int(ws)
        sizes = [
            int(v)
            for i in self.rank_info.values()
            if isinstance(v := i.get("world_size"), int) and v > 0
        ]
        return max(sizes) if sizes else None


def _frame(rows: list[dict], columns: Iterable[str]) -> Any:
    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=list(columns))
    return pd.DataFrame.from_records(rows)


# A table's rows as Python dicts cost ~10x its columns (issue 28: a 380 MB steps.jsonl took
# `analyze` to 3 GB), so a table is turned into columns this many rows at a time.
TABLE_BLOCK_ROWS = 1 << 12


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return None


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere
    nothing). Small arrays freed between live ones stay with the process: a column joined
    from its blocks (with 2.8M rows the steps table's load peaked at 2x its columns), a
    trace's per-chunk arrays (~420 MiB at 10M events). Changes no value."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _Table:
    """A table built from rows a block at a time, at most TABLE_BLOCK_ROWS row dicts alive:
    each block becomes a DataFrame as the whole table did (``pd.DataFrame.from_records``)
    and is kept as one array per column; :meth:`frame` joins each column's arrays.

    The frame is the one ``from_records`` makes of all the rows at once: the same columns
    in the same order (first appearance), dtypes and values (a column of one dtype in
    every block, or of ints and floats with rows that lack it, is joined as it is; any
    other mix is re-inferred by pandas from its values as objects). One difference, only
    where a column mixes kinds that pandas keeps as objects (e.g. strings and numbers): a
    block whose part of it pandas made floats holds floats and NaN there where the rows
    held ints and nulls. A table of one block is that block's frame."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.lengths: list[int] = []
        self._first: Any = None  # the first block's frame, split into columns at the second
        self._columns: dict[str, list[tuple[int, Any]]] = {}  # name -> [(block, array)]

    def append(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= TABLE_BLOCK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self.rows:
            return
        import pandas as pd

        block = pd.DataFrame.from_records(self.rows)
        self.rows = []
        self.lengths.append(len(block))
        if len(self.lengths) == 1:
            self._first = block
            return
        if self._first is not None:
            self._split(self._first, 0)
            self._first = None
        self._split(block, len(self.lengths) - 1)

    def _split(self, block: Any, index: int) -> None:
        """Copy each column of ``block`` out on its own (a column of a 2-D block would
        keep the whole block alive until its last column is joined)."""
        import numpy as np

        for name in block.columns:
            column = block[name]
            if isinstance(column.dtype, np.dtype):
                values = column.to_numpy(copy=True)
            else:
                values = column.array.copy()
            self._columns.setdefault(name, []).append((index, values))

    def frame(self, columns: Iterable[str]) -> Any:
        """The table as a DataFrame (``columns``, no rows, when it has no rows)."""
        import pandas as pd

        self._flush()
        if not self.lengths:
            return pd.DataFrame(columns=list(columns))
        if self._first is not None:
            frame, self._first = self._first, None
            return frame
        joined = {}
        large = sum(self.lengths) > 16 * TABLE_BLOCK_ROWS
        for name in list(self._columns):
            joined[name] = self._join(self._columns.pop(name))
            if large:  # the blocks' arrays come from the C heap, which keeps what they free
                release_free_memory()
        self.lengths = []
        return pd.DataFrame(joined, copy=False)

    def _join(self, pieces: list[tuple[int, Any]]) -> Any:
        """One column from its blocks' arrays (rows of a block without it: NaN, as in
        ``from_records``), each piece dropped once copied."""
        import numpy as np

        whole = len(pieces) == len(self.lengths)
        kinds = {values.dtype for _, values in pieces}
        numeric = kinds <= {np.dtype(np.int64), np.dtype(np.float64)}
        if whole and len(kinds) == 1 and next(iter(kinds)) != np.dtype(object):
            first = pieces[0][1]
            if isinstance(first, np.ndarray):
                return np.concatenate([values for _, values in pieces])
            return type(first)._concat_same_type([values for _, values in pieces])
        if numeric or (whole and kinds == {np.dtype(object)}):
            dtype = np.dtype(object) if not numeric else np.dtype(np.float64)
            return self._fill(pieces, dtype)
        from pandas.core.internals.construction import convert_object_array

        return convert_object_array([self._fill(pieces, np.dtype(object))], dtype=None)[0]

    def _fill(self, pieces: list[tuple[int, Any]], dtype: Any) -> Any:
        """The column as one ``dtype`` array, NaN in the blocks without it."""
        import numpy as np

        out = np.full(sum(self.lengths), np.nan, dtype=dtype)
        starts = np.concatenate([[0], np.cumsum(self.lengths)])
        while pieces:
            index, values = pieces.pop(0)
            start = starts[index]
            if dtype == np.dtype(object) and not isinstance(values, np.ndarray):
                values = values.to_numpy(dtype=object)
            out[start : start + len(values)] = values
        return out


STEP_COLUMNS = (
    "rank",
    "step",
    "start_ns",
    "end_ns",
    "data_ns",
    "optimizer_ns",
    "cpu_ns",
    "runq_ns",
    "threads_runq_ns",
    "source",
)
COLLECTIVE_COLUMNS = (
    "rank",
    "pg_name",
    "pg_desc",
    "pg_size",
    "pg_ranks",
    "seq",
    "op",
    "in_bytes",
    "out_bytes",
    "dtype",
    "in_sizes",
    "out_sizes",
    "enqueue_ns",
    "start_ns",
    "end_ns",
    "step",
    "record_id",
    "source",
)
REGION_COLUMNS = ("rank", "name", "start_ns", "end_ns", "step")
GPU_COLUMNS = (
    "node",
    "t_ns",
    "gpu",
    "uuid",
    "util_gpu",
    "util_mem",
    "mem_used",
    "mem_total",
    "power_w",
    "sm_clock_mhz",
    "throttle_reasons",
    "pcie_tx_kbs",
    "pcie_rx_kbs",
    "nvlink_tx_kbs",
    "nvlink_rx_kbs",
    "temp_c",
)
HOST_COLUMNS = (
    "node",
    "t_ns",
    "cpu_percent",
    "mem_used",
    "mem_total",
    "proc_cpu_percent",
    "proc_rss",
)


class _Listing:
    """The names in each directory of a run, each directory listed once as a reader
    asks: a directory that cannot be listed is one warning, and none of its files is
    looked for (one unreadable rank directory: one line, not one per file)."""

    def __init__(self, warnings: list[str] | None) -> None:
        self.warnings = warnings
        self._names: dict[Path, frozenset[str]] = {}

    def names(self, directory: Path) -> frozenset[str]:
        names = self._names.get(directory)
        if names is None:
            listed = list_dir(directory, self.warnings) if is_dir(directory) else None
            names = self._names[directory] = frozenset(listed or ())
        return names

    def has(self, path: Path) -> bool:
        """Whether ``path`` is an entry of its (listable) directory."""
        return path.name in self.names(path.parent)


def _read_rank_table(
    run: Path, ranks: list[int], table: str, warnings: list[str], listing: _Listing
) -> list[dict]:
    rows: list[dict] = []
    for r in ranks:
        path = table_path(rank_dir(run, r), table)
        if not listing.has(path):
            continue
        for row in iter_jsonl(path, warnings, schema=table):
            row["rank"] = r
            rows.append(row)
    return rows


def _read_rank_frame(
    run: Path,
    ranks: list[int],
    table: str,
    warnings: list[str],
    listing: _Listing,
    offsets: Mapping[int, int],
    columns: Iterable[str],
) -> Any:
    """A per-rank table as a DataFrame, built a block of rows at a time (:class:`_Table`),
    each row's instants moved by its rank's clock offset (``offsets``) as it is read."""
    built = _Table()
    for r in ranks:
        path = table_path(rank_dir(run, r), table)
        if not listing.has(path):
            continue
        offset = offsets.get(r)
        for row in iter_jsonl(path, warnings, schema=table):
            row["rank"] = r
            if offset:
                _shift_instants([row], offset)
            built.append(row)
    return built.frame(columns)


def _merge_collective_times(collectives: list[dict], times: list[dict]) -> None:
    """Fill start/end stamps recorded separately (e.g. by a DDP comm hook) into the
    collective rows, matched on (rank, pg_name, seq)."""
    if not times:
        return
    index = {(c["rank"], c.get("pg_name"), c.get("seq")): c for c in collectives}
    for t in times:
        row = index.get((t["rank"], t.get("pg_name"), t.get("seq")))
        if row is None:
            continue
        for key in ("start_ns", "end_ns"):
            if t.get(key) is not None and row.get(key) is None:
                row[key] = t[key]
        if t.get("source"):
            row["time_source"] = t["source"]


def load_run(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Run:
    """Read a run directory written by ``gpudiag trace``; or the directories of one
    multi-node job's nodes (a list of them, or a parent holding them, see
    :func:`node_parts`), merged into one run.

    Never raises for bad content: unreadable pieces are skipped and described, one
    line each, in ``Run.warnings``. Raises :class:`RunFormatError` only when ``path``
    is not a run directory at all.
    """
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        if len(paths) == 1:
            return load_run(paths[0])
        for p in paths:
            if not is_dir(p):
                raise RunFormatError(f"{p}: not a directory")
        return merge_runs([_load_one(p) for p in paths], Path(os.path.commonpath(paths)))
    run = Path(path)
    if not is_dir(run):
        raise RunFormatError(f"{run}: not a directory")
    parts = node_parts(run)
    if parts:
        return merge_runs([_load_one(p) for p in parts], run)
    return _load_one(run)


def _read_manifests(
    run: Path, warnings: list[str], listing: _Listing | None = None
) -> dict[str, Any]:
    """manifest.json, with every manifest.node<K>.json under ``nodes`` and the whole
    job's status and hosts (:func:`merge_manifests`). A node's own directory holds only
    its manifest.node<K>.json: that one is then the manifest."""
    names = (listing or _Listing(warnings)).names(run)
    manifest = read_object(run / MANIFEST, MANIFEST, warnings) if MANIFEST in names else None
    if manifest is not None:
        _reader_notes(manifest, run / MANIFEST, warnings)
    nodes: list[tuple[int, dict[str, Any]]] = []
    for name in sorted(names):
        m = _NODE_MANIFEST_RE.match(name)
        extra = read_object(run / name, MANIFEST, warnings) if m else None
        if m and isinstance(extra, dict):
            _reader_notes(extra, run / name, warnings)
            nodes.append((int(m.group(1)), extra))
    if manifest is None:
        if not nodes:
            return {}
        return merge_manifests(nodes)
    return merge_manifests([(manifest_node(manifest), manifest), *nodes]) if nodes else manifest


def _load_one(run: Path) -> Run:
    warnings: list[str] = []
    names = list_dir(run, warnings)
    if names is None:
        raise RunFormatError(warnings[0])
    listing = _Listing(warnings)
    manifest = _read_manifests(run, warnings, listing)
    if manifest.get("world_size") is not None and manifest["world_size"] < 1:
        bad_input(warnings, f"{run / MANIFEST}: world_size {manifest['world_size']}; ignored")
        del manifest["world_size"]
    version = manifest.get("format_version")
    if version is not None and version > FORMAT_VERSION:
        warnings.append(
            f"{run / MANIFEST}: format_version {version} is newer than this gpudiag "
            f"reads ({FORMAT_VERSION}); reading what it can"
        )
    ranks, trace_files = _rank_layout(run, names, warnings)
    nodes = list_nodes(run)
    offsets = clock_offsets(run, manifest, nodes, warnings, listing)
    rank_offsets = _rank_offsets(run, ranks, offsets)

    collectives = _read_rank_table(run, ranks, COLLECTIVES, warnings, listing)
    _merge_collective_times(
        collectives, _read_rank_table(run, ranks, COLLECTIVE_TIMES, warnings, listing)
    )

    node_tables: dict[str, _Table] = {t: _Table() for t in NODE_TABLES}
    for n in nodes:
        for table in NODE_TABLES:
            p = table_path(node_dir(run, n), table)
            if listing.has(p):
                for row in iter_jsonl(p, warnings, schema=table):
                    row["node"] = n
                    if offsets.get(n):
                        _shift_instants([row], offsets[n])
                    node_tables[table].append(row)
    if offsets:
        _shift_rows(collectives, "rank", rank_offsets)

    result = Run(
        path=run,
        manifest=manifest,
        steps=_read_rank_frame(run, ranks, STEPS, warnings, listing, rank_offsets, STEP_COLUMNS),
        collectives=_frame(collectives, COLLECTIVE_COLUMNS),
        regions=_read_rank_frame(
            run, ranks, REGIONS, warnings, listing, rank_offsets, REGION_COLUMNS
        ),
        ddp_stats=_read_rank_frame(
            run, ranks, DDP_STATS, warnings, listing, rank_offsets, ("rank", "step")
        ),
        gpu_samples=node_tables[GPU_SAMPLES].frame(GPU_COLUMNS),
        host_samples=node_tables[HOST_SAMPLES].frame(HOST_COLUMNS),
        lint=read_lint(run, warnings) if LINT in names else None,
        hang_report=read_hang_reports(run, warnings),
        warnings=warnings,
        clock_offsets=rank_offsets,
        trace_files=trace_files,
    )
    for r in ranks:
        _read_rank_files(run, r, result, listing)
    if offsets:
        for docs in (result.rank_info, result.statuses):
            _shift_rows([d for r, d in docs.items() if r in rank_offsets], None, rank_offsets)
    return result


# --------------------------------------------------------------------------- clocks
# Instants (epoch ns) of the run tables; the other *_ns columns are durations.
INSTANT_COLUMNS = frozenset({"start_ns", "end_ns", "enqueue_ns", "t_ns", "call_ns", "returned_ns"})
# Larger than any plausible clock error, smaller than nonsense: an offset beyond it is
# ignored with a warning.
MAX_CLOCK_OFFSET_NS = 7 * 24 * 3600 * 10**9


def clock_offsets(
    run: Path,
    manifest: Mapping[str, Any],
    nodes: Iterable[int],
    warnings: list[str],
    listing: _Listing | None = None,
) -> dict[int, int]:
    """node -> ns to add to that node's times to put them on node 0's clock, from each
    node's manifest ``clock`` (else its ``node<K>/clock.json``). Node 0 and nodes
    without a measurement: none (their times are read as written)."""
    manifests: dict[int, Any] = {manifest_node(manifest): manifest}
    nested = manifest.get("nodes")
    if isinstance(nested, dict):
        manifests.update({int(k): v for k, v in nested.items() if str(k).isdigit()})
    out: dict[int, int] = {}
    for n in sorted(set(nodes) | set(manifests)):
        if n == 0:
            continue
        record = manifests.get(n, {}).get("clock") if isinstance(manifests.get(n), dict) else None
        source: Path | str = f"manifest of node {n}"
        if not isinstance(record, dict):
            source = node_dir(run, n) / CLOCK
            found = (listing or _Listing(warnings)).has(source)
            record = read_json(source, warnings) if found else None
        offset = record.get("offset_ns") if isinstance(record, dict) else None
        if not _is_int(offset) or not offset:
            continue
        if abs(offset) > MAX_CLOCK_OFFSET_NS:
            bad_input(warnings, f"{source}: clock offset_ns {offset} is implausible; ignored")
            continue
        out[n] = int(offset)
    return out


def _rank_offsets(run: Path, ranks: Iterable[int], offsets: dict[int, int]) -> dict[int, int]:
    """rank -> clock offset of its node (rank_info.json's node_rank)."""
    if not offsets:
        return {}
    out = {}
    for r in ranks:
        info = read_json(rank_dir(run, r) / RANK_INFO)
        node = info.get("node_rank") if isinstance(info, dict) else None
        if isinstance(node, int) and node in offsets:
            out[r] = offsets[node]
    return out


def _shift_rows(rows: list[dict], key: str | None, offsets: Mapping[int, int]) -> None:
    """Add the row's offset (by ``key``, or by its ``rank`` field) to its instants."""
    for row in rows:
        offset = offsets.get(row.get(key or "rank"))  # type: ignore[arg-type]
        if offset:
            _shift_instants([row], offset)


def _shift_instants(rows: list[dict], offset: int) -> None:
    if not offset:
        return
    for row in rows:
        for col in INSTANT_COLUMNS:
            value = row.get(col)
            if isinstance(value, int) and _is_int(value):
                row[col] = value + offset


# --------------------------------------------------------------------------- multi-node
# One multi-node job: every launcher writes into one shared run directory (node 0's
# manifest.json, the others' manifest.node<K>.json), or each into its own directory
# (`gpudiag analyze node0_dir node1_dir`, or their parent). Either way the reader sees
# one run.

# Worst first: a job whose one node failed failed.
_STATUS_ORDER = ("failed", "hang", "interrupted", "launcher_lost", "running", "ok")


def manifest_node(manifest: Mapping[str, Any]) -> int:
    node = manifest.get("node_rank")
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else 0


def _worst_status(statuses: Iterable[Any]) -> Any:
    known = [s for s in statuses if s in _STATUS_ORDER]
    return min(known, key=_STATUS_ORDER.index) if known else None


def merge_manifests(
    parts: Sequence[tuple[int, dict[str, Any]]],
    statuses: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """One job's manifest from its nodes' (node rank, manifest): the lowest node's
    (node 0's), with every other node's under ``nodes`` ({node: manifest}), every
    node's ``hosts``, the worst status, and the union of failed ranks and steps. A
    failure and exit code come from node 0 unless only another node has one.

    Ranks launched separately (:func:`_separately_launched`: every part says node 0)
    are ordered by their lowest traced rank, and the failure is decided again across
    the parts (:func:`decide_failure`, with the ranks' ``statuses`` when given): each
    launcher saw only its own rank, so the order of the arguments must not pick it."""
    apart = len(parts) > 1 and _separately_launched([m for _, m in parts])
    ordered = sorted(parts, key=lambda p: (p[0], _lowest_rank(p[1]) if apart else 0))
    main = dict(ordered[0][1])
    others = ordered[1:]
    if not others:
        return main
    nodes = dict(main.get("nodes") or {})
    nodes.update({n: m for n, m in others})
    main["nodes"] = nodes
    manifests = [m for _, m in ordered]
    hosts: list[Any] = []
    for m in manifests:
        hosts += [h for h in m.get("hosts") or [] if isinstance(h, dict)]
    main["hosts"] = hosts
    main["status"] = _worst_status(m.get("status") for m in manifests) or main.get("status")
    sizes = [w for m in manifests if isinstance(w := m.get("world_size"), int) and w > 0]
    if sizes:
        main["world_size"] = max(sizes)
    steps: dict[str, Any] = {}
    failed: list[Any] = []
    for m in manifests:
        if isinstance(m.get("steps_completed"), dict):
            steps.update(m["steps_completed"])
        failed += [r for r in m.get("failed_ranks") or [] if r not in failed]
    main["steps_completed"] = dict(sorted(steps.items(), key=lambda kv: str(kv[0])))
    main["failed_ranks"] = failed
    if apart:
        _decide_merged_failure(main, manifests, statuses)
    elif main.get("failure") is None:
        other = next((m for m in manifests if isinstance(m.get("failure"), dict)), None)
        if other is not None:
            main["failure"] = other["failure"]
            main["exit_code"] = other.get("exit_code")
    if apart:
        incomplete, main["ranks_elsewhere"] = _apart_incomplete(manifests)
    else:
        incomplete = [x for m in manifests for x in m.get("incomplete") or []]
    main["incomplete"] = incomplete or None
    traced = sorted({r for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)})
    if traced:
        main["traced_ranks"] = traced
        size = main.get("world_size")
        if isinstance(size, int):
            main["untraced_ranks"] = [r for r in range(size) if r not in traced]
    return main


def _job_key(manifest: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What the launchers of one job share: the id node 0 published at start-up
    (``clock.job_id``), else the rendezvous they were given. None for a one-node run."""
    nnodes = str(manifest.get("nnodes") or "1")
    if nnodes in ("1", "1:1"):
        return None
    clock = manifest.get("clock")
    if isinstance(clock, dict) and isinstance(clock.get("job_id"), str):
        return ("job", clock["job_id"])
    launch = manifest.get("launch")
    argv = launch.get("torchrun_argv") if isinstance(launch, dict) else None
    if not isinstance(argv, list):
        return None
    flags = {
        a: b for a, b in zip(argv, [*argv[1:], None], strict=True) if b and not b.startswith("--")
    }
    return (
        "rdzv",
        nnodes,
        flags.get("--rdzv-backend", "static"),
        flags.get("--rdzv-endpoint"),
        flags.get("--rdzv-id"),
        flags.get("--master-addr"),
        flags.get("--master-port"),
    )


def _part_manifest(directory: Path) -> dict[str, Any] | None:
    """The one manifest of a node's own directory (manifest.json, or a single
    manifest.node<K>.json), without warnings: None when there is none or several."""
    listed = list_dir(directory)
    if listed is None:
        return None
    names = [MANIFEST] if MANIFEST in listed and is_regular_file(directory / MANIFEST) else []
    names += [n for n in listed if _NODE_MANIFEST_RE.match(n)]
    if len(names) != 1:
        return None
    obj = read_json(directory / names[0])
    if not isinstance(obj, dict):
        return None
    m = _NODE_MANIFEST_RE.match(names[0])
    if m:
        obj["node_rank"] = int(m.group(1))
    if not isinstance(obj.get("clock"), dict):
        # a launcher killed before it wrote the clock into its manifest left it here
        clock = read_json(node_dir(directory, manifest_node(obj)) / CLOCK)
        if isinstance(clock, dict):
            obj["clock"] = clock
    return obj


def same_job(directories: Sequence[Path]) -> bool:
    """Whether these run directories are the parts of one job: the per-node directories
    of a multi-node job (each holds one node's manifest, the node ranks differ, they name
    the same job: node 0's id, else the same rendezvous), or ranks launched separately by
    hand (:func:`_separately_launched`); either way their launchers ran at the same
    time."""
    if len(directories) < 2:
        return False
    manifests = [_part_manifest(Path(d)) for d in directories]
    if any(m is None for m in manifests):
        return False
    ms = [m for m in manifests if m is not None]
    if not _separately_launched(ms):
        keys = {_job_key(m) for m in ms}
        if len(keys) != 1 or None in keys:
            return False
        if len({manifest_node(m) for m in ms}) != len(ms):
            return False
    # on node 0's clock (a node's manifest stamps are its own); a running node ends now
    starts = [t + _manifest_offset(m) for m in ms if isinstance(t := m.get("start_ns"), int)]
    ends = [
        t + _manifest_offset(m) if m.get("end_ns") else time.time_ns()
        for m in ms
        if isinstance(t := m.get("end_ns") or 0, int)
    ]
    if len(starts) != len(ms) or len(ends) != len(ms):
        return False
    return max(starts) <= min(ends)


def _separately_launched(manifests: Sequence[Mapping[str, Any]]) -> bool:
    """Ranks of one job each started by its own `gpudiag trace` (one process each, the
    rank passed to init_process_group): the same rendezvous (``init_method``, not a
    store object), the same world size, and traced ranks that do not overlap."""
    methods = {m.get("init_method") for m in manifests}
    sizes = {m.get("world_size") for m in manifests}
    if len(methods) != 1 or len(sizes) != 1:
        return False
    method, size = methods.pop(), sizes.pop()
    if not isinstance(method, str) or method in ("", "store") or not isinstance(size, int):
        return False
    traced = [m.get("traced_ranks") for m in manifests]
    if not all(isinstance(t, list) and t for t in traced):
        return False
    flat = [r for t in traced if isinstance(t, list) for r in t]
    return len(flat) == len(set(flat)) and all(isinstance(r, int) and 0 <= r < size for r in flat)


def _own_incomplete(manifest: Mapping[str, Any]) -> list[Any]:
    """A separately launched part's ``incomplete`` reasons without its launcher's "rank(s)
    [...] left nothing in this directory: started by another launcher": read with the
    other parts, those ranks are in another part, or named once for the whole run
    (:func:`_apart_incomplete`)."""
    reasons = list(manifest.get("incomplete") or [])
    elsewhere = manifest.get("ranks_elsewhere")
    if not isinstance(elsewhere, list) or not elsewhere:
        return reasons
    note = f"rank(s) {elsewhere} of the world of "
    return [
        x
        for x in reasons
        if not (isinstance(x, str) and x.startswith(note) and "left nothing in this" in x)
    ]


def _apart_incomplete(manifests: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[int]]:
    """The ``incomplete`` reasons and ``ranks_elsewhere`` of separately launched parts read
    as one run: each part's own reasons, less its note on the ranks it left to the other
    launchers; the ranks of the world that no part traced, named once."""
    traced = {r for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)}
    reasons = [x for m in manifests for x in _own_incomplete(m)]
    missing = sorted(
        {
            r
            for m in manifests
            for r in m.get("ranks_elsewhere") or []
            if _is_int(r) and r not in traced
        }
    )
    if missing:
        sizes = [w for m in manifests if isinstance(w := m.get("world_size"), int)]
        reasons.append(
            f"rank(s) {missing} of the world of {max(sizes) if sizes else '?'} left nothing "
            "in any of the directories given: started by another launcher (give its --out "
            "too) or not traced"
        )
    return reasons, missing


def _apart_warnings(part: Run) -> list[str]:
    """A separately launched part's warnings, its "run incomplete" note (written when its
    manifest was read alone) redone without its note on the ranks it left to the other
    launchers (:func:`_own_incomplete`)."""
    reasons = part.manifest.get("incomplete")
    if not isinstance(reasons, list) or not reasons:
        return list(part.warnings)
    own = _own_incomplete(part.manifest)
    if len(own) == len(reasons):
        return list(part.warnings)

    def note(items: list[Any]) -> str:
        shown = "; ".join(str(x) for x in items[:3])
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        return f"run incomplete: {shown}{more}"

    old, new = note(reasons), note(own) if own else None
    out: list[str] = []
    for w in part.warnings:
        if w.startswith(str(part.path)) and w.endswith(f": {old}"):
            if new is not None:
                out.append(w[: -len(old)] + new)
            continue
        out.append(w)
    return out


def _lowest_rank(manifest: Mapping[str, Any]) -> int:
    """The lowest rank a separately launched part traced (the order of the parts)."""
    listed = manifest.get("traced_ranks")
    traced = [r for r in listed if _is_int(r)] if isinstance(listed, list) else []
    return min(traced) if traced else 1 << 62


# --------------------------------------------------------------------------- the cause
# Which rank caused a failed job. The launcher decides it when the job ends
# (gpudiag/capture/blame.py, with the agent's exit codes and the order of deaths); the
# functions below decide it again from the ranks' statuses and the parts' failures when
# one launcher saw only part of the job (ranks launched separately), and for `analyze`.

EARLY_EXIT = "early_exit"  # a failure's exc_type: the rank left the job with exit code 0
# a failure's exc_type when the rank ended without an error of its own
_ENDED_TYPES = frozenset({"died", "node_lost", "KeyboardInterrupt", EARLY_EXIT})


def cause_kind(failure: Mapping[str, Any]) -> int:
    """How a failure (a status.json, or a manifest's ``failure``) ranks as the cause of
    a failed job: 0 an error of the rank's own, 1 the rank died, was ended by a signal or
    left the job early with exit code 0 (its peers then lost their connection), 2 a
    peer's connection error (a consequence of another rank's end)."""
    if is_peer_error(failure):
        return 2
    exc = failure.get("exc_type")
    if (
        failure.get("signal")
        or failure.get("status") == "interrupted"
        or exc in _ENDED_TYPES
        or (isinstance(exc, str) and exc.startswith("SIG"))
    ):
        return 1
    return 0


def _end_ns(status: Any) -> int | None:
    end = status.get("end_ns") if isinstance(status, Mapping) else None
    return end if _is_int(end) else None


def left_early(statuses: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Ranks that ended ok (exit code 0) before any rank failed, in a job whose failures
    include a peer's connection error: they left while their peers still needed them
    (``sys.exit(0)``, a return before a collective the others are in), the peers'
    connection errors followed. Earliest first. A rank that ended ok after a peer had
    failed, or in a job with no peer error, is never one."""
    ends = {r: e for r, s in statuses.items() if (e := _end_ns(s)) is not None}
    failed = [r for r in ends if is_failed(statuses[r].get("status"))]
    if not any(is_peer_error(statuses[r]) for r in failed):
        return []
    first = min(ends[r] for r in failed)
    early = [r for r in ends if statuses[r].get("status") == "ok" and ends[r] < first]
    return sorted(early, key=lambda r: (ends[r], r))


def early_exit_failure(
    rank: int,
    peers: Sequence[int],
    steps: int | None,
    end_ns: int | None,
    without_status: bool = False,
) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank that left the job with exit code 0 while
    its peers were still in it (``steps``: the steps it completed)."""
    how = "exit code 0, no status written: os._exit(0)?" if without_status else "exit code 0"
    after = f" after {steps} step(s)" if steps is not None else ""
    message = f"left the job early ({how}){after} while its peers were still in it"
    if peers:
        ranks = ", ".join(str(r) for r in peers)
        message += (
            f"; rank{'s' if len(peers) > 1 else ''} {ranks} then lost the connection to it "
            "(a consequence, not the cause)"
        )
    message += (
        ": a rank that returns or calls sys.exit(0) / os._exit(0) before its peers' last "
        "collective leaves them without a partner"
    )
    return {
        "rank": rank,
        "exc_type": EARLY_EXIT,
        "message": message,
        "traceback": None,
        "exit_code": 0,
        "signal": None,
        "last_step": steps - 1 if steps else None,
        "end_ns": end_ns,
    }


def _ended_without_status(
    parts: Sequence[Run], statuses: Mapping[int, Any]
) -> dict[int, dict[str, Any]]:
    """A separately launched rank whose launcher ended ok (exit code 0) but that wrote
    no status.json (``os._exit(0)``): what its steps table says of its end."""
    out: dict[int, dict[str, Any]] = {}
    for part in parts:
        if part.manifest.get("status") != "ok" or part.steps is None or not len(part.steps):
            continue
        for r in part.manifest.get("missing_status_ranks") or []:
            if not _is_int(r) or r in statuses or "rank" not in part.steps:
                continue
            rows = part.steps[part.steps["rank"] == r]
            if len(rows) and "end_ns" in rows:
                out[r] = {
                    "status": "ok",
                    "exit_code": 0,
                    "end_ns": int(rows["end_ns"].max()),
                    "steps_completed": len(rows),
                    "no_status": True,
                }
    return out


def _decide_merged_failure(
    main: dict[str, Any],
    manifests: Sequence[Mapping[str, Any]],
    statuses: Mapping[int, Mapping[str, Any]] | None,
) -> None:
    """The failure of ranks launched separately, decided across every part: a rank with
    an error of its own, then one that died, was signalled or left early, then a peer's
    connection error; among equals the earliest end, then the lowest rank."""
    statuses = statuses or {}
    part_of = {r: m for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)}
    found: dict[int, tuple[int, int, dict[str, Any]]] = {}
    for m in manifests:
        f = m.get("failure")
        if not isinstance(f, dict) or not _is_int(f.get("rank")):
            continue
        end = _end_ns(f) or _end_ns(statuses.get(f["rank"])) or _end_ns(m) or 0
        found[f["rank"]] = (cause_kind(f), end, f)
    early = [r for r in left_early(statuses) if r not in found]
    peers = sorted(
        (r for r, (kind, _, _) in found.items() if kind == 2), key=lambda r: (found[r][1], r)
    )
    for r in early:
        s = statuses[r]
        steps = s.get("steps_completed") if _is_int(s.get("steps_completed")) else None
        failure = early_exit_failure(r, peers, steps, _end_ns(s), bool(s.get("no_status")))
        found[r] = (1, _end_ns(s) or 0, failure)
    if not found:
        return
    order = sorted(found, key=lambda r: (found[r][0], found[r][1], r))
    cause = order[0]
    failure = dict(found[cause][2])
    before = failure.get("consequences")
    rows = [c for c in before if isinstance(c, dict)] if isinstance(before, list) else []
    seen = {cause, *(c.get("rank") for c in rows)}
    for r in order[1:]:
        if r in seen:
            continue
        other = found[r][2]
        status = statuses.get(r)
        rows.append(
            {
                "rank": r,
                "status": status.get("status") if isinstance(status, Mapping) else "failed",
                "exc_type": other.get("exc_type"),
                "message": str(other.get("message") or "")[:300] or None,
            }
        )
    failure["consequences"] = rows
    main["failure"] = failure
    codes = [part_of[r].get("exit_code") for r in order if r in part_of]
    code = next((c for c in codes if _is_int(c) and c != 0), None)
    if code is not None:
        main["exit_code"] = code
    failed = main.get("failed_ranks")
    main["failed_ranks"] = order + [
        r for r in (failed if isinstance(failed, list) else []) if r not in order
    ]


def _manifest_offset(manifest: Mapping[str, Any]) -> int:
    """The node's clock offset to node 0 its manifest records (0 when none)."""
    clock = manifest.get("clock")
    offset = clock.get("offset_ns") if isinstance(clock, dict) else None
    if isinstance(offset, int) and _is_int(offset) and abs(offset) <= MAX_CLOCK_OFFSET_NS:
        return offset
    return 0


def node_parts(directory: str | os.PathLike[str]) -> list[Path]:
    """The per-node run directories of one job directly under ``directory`` (ordered
    by node), or [] when ``directory`` is itself a run or holds no such set."""
    directory = Path(directory)
    if not is_dir(directory) or is_run_dir(directory):
        return []
    children = [directory / n for n in list_dir(directory) or () if is_run_dir(directory / n)]
    if not same_job(children):
        return []
    return sorted(children, key=lambda p: manifest_node(_part_manifest(p) or {}))


def launched_separately(directories: Sequence[Path]) -> bool:
    """Parts of one job (:func:`same_job`) whose ranks were each started by their own
    `gpudiag trace`, not the per-node directories of a multi-node launch."""
    manifests = [_part_manifest(Path(d)) for d in directories]
    return (
        len(manifests) > 1
        and all(m is not None for m in manifests)
        and _separately_launched([m for m in manifests if m is not None])
    )


def group_node_dirs(paths: Sequence[Path]) -> list[list[Path]]:
    """`gpudiag analyze A B ...`: the paths as runs to analyse, the per-node
    directories of one job (all of the paths) as one."""
    if len(paths) >= 2 and all(is_dir(p) for p in paths) and same_job(paths):
        return [sorted(paths, key=lambda p: manifest_node(_part_manifest(Path(p)) or {}))]
    return [[p] for p in paths]


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    full = [f for f in frames if len(f)]
    if not full:
        return frames[0]
    return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0]


def merge_runs(runs: Sequence[Run], path: Path) -> Run:
    """The per-node directories of one job read as one run (ranks and nodes are
    disjoint: each node wrote its own)."""
    apart = _separately_launched([r.manifest for r in runs])
    parts = sorted(
        runs, key=lambda r: (manifest_node(r.manifest), _lowest_rank(r.manifest) if apart else 0)
    )
    statuses = {k: v for r in parts for k, v in r.statuses.items()}
    if apart:
        statuses.update(_ended_without_status(parts, statuses))
    manifest = merge_manifests([(manifest_node(r.manifest), r.manifest) for r in parts], statuses)
    merged = Run(
        path=path,
        manifest=manifest,
        steps=_concat([r.steps for r in parts]),
        collectives=_concat([r.collectives for r in parts]),
        regions=_concat([r.regions for r in parts]),
        ddp_stats=_concat([r.ddp_stats for r in parts]),
        gpu_samples=_concat([r.gpu_samples for r in parts]),
        host_samples=_concat([r.host_samples for r in parts]),
        lint=next((r.lint for r in parts if r.lint is not None), None),
        hang_report=merge_hang_reports(
            [(manifest_node(r.manifest), r.hang_report) for r in parts if r.hang_report]
        ),
        warnings=[w for r in parts for w in r.warnings],
    )
    if apart:  # a part's ranks elsewhere are in another part, or named once here
        merged.warnings = [w for r in parts for w in _apart_warnings(r)]
        if manifest.get("ranks_elsewhere"):
            merged.warnings.append(f"{path}: run incomplete: {manifest['incomplete'][-1]}")
    for r in parts:
        merged.rank_info.update(r.rank_info)
        merged.statuses.update(r.statuses)
        merged.summaries.update(r.summaries)
        merged.trace_files.update(r.trace_files)
        merged.stacks.update(r.stacks)
        merged.clock_offsets.update(r.clock_offsets)
    merged.parts = [r.path for r in parts]
    return merged


def _read_rank_files(run: Path, r: int, result: Run, listing: _Listing) -> None:
    rdir = rank_dir(run, r)
    for name, target in (
        (RANK_INFO, result.rank_info),
        (STATUS, result.statuses),
        (SUMMARY, result.summaries),
    ):
        obj = read_object(rdir / name, name, result.warnings) if listing.has(rdir / name) else None
        if obj is not None:
            target[r] = obj
    if listing.has(rdir / STACKS):
        text = read_text(rdir / STACKS, result.warnings)
        if text is not None:
            result.stacks[r] = text


def load_summaries(
    path: str | os.PathLike[str], warnings: list[str] | None = None
) -> tuple[dict[str, Any], dict[int, dict]]:
    """Only the manifest and per-rank summaries: how a 1000-rank run is read without
    touching any raw trace or table. What could not be read is described in
    ``warnings``, one line each."""
    run = Path(path)
    parts = node_parts(run)
    if parts:
        loaded = [load_summaries(p, warnings) for p in parts]
        manifest = merge_manifests([(manifest_node(m), m) for m, _ in loaded])
        return manifest, {r: s for _, part in loaded for r, s in part.items()}
    warnings = [] if warnings is None else warnings
    listing = _Listing(warnings)
    manifest = _read_manifests(run, warnings, listing)
    summaries: dict[int, dict] = {}
    for r in list_ranks(run):
        path = rank_dir(run, r) / SUMMARY
        obj = read_object(path, SUMMARY, warnings) if listing.has(path) else None
        if obj is not None:
            summaries[r] = obj
    return manifest, summaries


# --------------------------------------------------------------------------- lint.json


@dataclass(frozen=True)
class LintDiagnostic:
    """One finding of `gpudiag lint` as lint.json holds it (gpudiag/lint/result.py)."""

    code: str
    rule: str
    severity: str
    path: str
    line: int
    col: int
    message: str
    why: str = ""
    fix: str = ""
    relates_to: str | None = None  # the `gpudiag analyze` finding kind of the same cost

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class LintFileError:
    path: str
    line: int
    message: str


@dataclass
class LintReport:
    """lint.json, typed: the files linted, the diagnostics, the files that could not be."""

    files: list[str]
    diagnostics: list[LintDiagnostic]
    errors: list[LintFileError]
    raw: dict[str, Any] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return self.raw


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_lint(obj: Any, source: str, warnings: list[str] | None = None) -> LintReport | None:
    """A lint.json document (or `LintResult.to_json()`) as a LintReport; None, with a
    one-line warning naming ``source``, when it is not one. Malformed entries are skipped."""
    if obj is None:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("findings", []), list):
        bad_input(warnings, f"{source}: not a gpudiag lint result; ignored")
        return None
    diagnostics = []
    skipped = 0
    for item in _as_list(obj.get("findings")):
        if not isinstance(item, dict) or not _text(item.get("code")) or not _text(item.get("path")):
            skipped += 1
            continue
        relates = item.get("relates_to")
        diagnostics.append(
            LintDiagnostic(
                code=item["code"],
                rule=_text(item.get("rule")),
                severity=_text(item.get("severity")),
                path=item["path"],
                line=_int(item.get("line")),
                col=_int(item.get("col")),
                message=_text(item.get("message")),
                why=_text(item.get("why")),
                fix=_text(item.get("fix")),
                relates_to=relates if isinstance(relates, str) and relates else None,
            )
        )
    if skipped:
        bad_input(warnings, f"{source}: {skipped} malformed lint finding(s) skipped")
    errors = [
        LintFileError(_text(e.get("path")), _int(e.get("line")), _text(e.get("message")))
        for e in _as_list(obj.get("errors"))
        if isinstance(e, dict)
    ]
    files = [f for f in _as_list(obj.get("files")) if isinstance(f, str)]
    return LintReport(files=files, diagnostics=diagnostics, errors=errors, raw=obj)


def read_lint(run: str | os.PathLike[str], warnings: list[str] | None = None) -> LintReport | None:
    """<run>/lint.json, typed; None when the run has none (or it is unreadable: warned)."""
    path = Path(run) / LINT
    obj = read_json(path, warnings)
    if obj is not None and _too_deep(obj):
        bad_input(warnings, f"{path}: nested deeper than {MAX_DEPTH} levels; ignored")
        return None
    return parse_lint(obj, str(path), warnings)


# --------------------------------------------------------------------------- live reading


class TableTail:
    """Incremental reader of one append-only JSON Lines table (`gpudiag watch`).

    Each :meth:`read` returns only the complete rows appended since the previous call:
    it remembers the byte offset after the last whole line, so a torn last line (a row
    being written right now) is left for the next call, never reported. A file that
    shrank or was replaced (other inode) is read again from its start (``resets``
    counts those). ``tail_bytes`` bounds the work: the first read, and any read that
    finds more than that many new bytes, starts that far from the end of the file at
    the next line start (``skipped_bytes`` counts what was passed over), so a reader
    that keeps only recent rows costs the same on a file of any length.

    A missing file is no problem (not written yet); one that is there but cannot be read
    (permission denied, a directory, a FIFO or a device in its place) gives no rows and
    says why in :attr:`problems`, as do malformed lines skipped so far.
    """

    def __init__(self, path: str | os.PathLike[str], tail_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.tail_bytes = tail_bytes
        self.offset = 0
        self.resets = 0
        self.malformed = 0
        self.skipped_bytes = 0
        self._inode: int | None = None
        self.problem: str | None = None  # why the last read could not read the file

    @property
    def problems(self) -> list[str]:
        """One line per problem, each naming the file: the last read's, and the malformed
        lines skipped so far."""
        out = [self.problem] if self.problem else []
        if self.malformed:
            out.append(f"{self.path}: {self.malformed} malformed line(s) skipped")
        return out

    def read(self) -> list[dict[str, Any]]:
        self.problem = None
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []  # not written yet
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path}: {read_problem(exc)}"
            return []
        if not stat.S_ISREG(st.st_mode):  # never a FIFO or a device
            self.problem = f"{self.path}: {read_problem(_not_regular(self.path, st.st_mode))}"
            return []
        if self._inode is not None and (st.st_ino != self._inode or st.st_size < self.offset):
            self.offset = 0  # truncated, or rotated to a new file
            self.resets += 1
        self._inode = st.st_ino
        if st.st_size <= self.offset:
            return []
        start = self.offset
        align = False
        if self.tail_bytes is not None and st.st_size - start > self.tail_bytes:
            start = st.st_size - self.tail_bytes
            align = start > 0
        try:
            with open_regular(self.path) as fh:
                fh.seek(start)
                data = fh.read(st.st_size - start)
        except OSError as exc:
            self.problem = f"{self.path}: {read_problem(exc)}"
            return []
        if align:  # begin at the first line start after the jump
            first = data.find(b"\n")
            if first < 0:
                return []
            data = data[first + 1 :]
            start += first + 1
        end = data.rfind(b"\n")
        if end < 0:
            return []  # only a torn line so far: read again next time
        self.skipped_bytes += start - self.offset
        self.offset = start + end + 1
        return self._parse(data[: end + 1])

    def _parse(self, chunk: bytes) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for line in chunk.split(b"\n"):
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except (ValueError, UnicodeDecodeError):
                self.malformed += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                self.malformed += 1
        return rows


def _loads(data: bytes) -> Any:
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a dependency
        return json.loads(data)
    return orjson.loads(data)


def read_rank_json(run: str | os.PathLike[str], rank: int, name: str) -> dict[str, Any] | None:
    """A rank's small JSON document (rank_info, status, inflight_live...) or None when
    missing, unreadable, or not an object: a live reader just tries again later."""
    obj = read_json(rank_dir(run, rank) / name)
    return obj if isinstance(obj, dict) else None


# Bytes read at most from the end of each table on a live reader's first read (and after
# a jump): enough for the recent window `gpudiag watch` keeps, whatever the file length.
LIVE_TAIL_BYTES = {
    STEPS: 48 * 1024,  # ~370 step rows (gpudiag watch keeps its window + 200)
    COLLECTIVES: 256 * 1024,  # ~700 collective rows
    COLLECTIVE_TIMES: 128 * 1024,
    GPU_SAMPLES: 64 * 1024,
    HOST_SAMPLES: 16 * 1024,
}
LIVE_RANK_TABLES = (STEPS, COLLECTIVES, COLLECTIVE_TIMES)


@dataclass
class LiveBatch:
    """What a :class:`LiveReader` poll found: new rows since the last poll, and the
    current small documents."""

    t_ns: int
    status: str | None  # run_status() of the manifest; None without a manifest
    manifest: dict[str, Any]
    node_manifests: dict[int, dict[str, Any]]
    hang_report: bool
    rank_rows: dict[str, dict[int, list[dict[str, Any]]]]  # table -> rank -> new rows
    node_rows: dict[str, dict[int, list[dict[str, Any]]]]  # table -> node -> new rows
    rank_info: dict[int, dict[str, Any]]
    statuses: dict[int, dict[str, Any]]
    inflight: dict[int, dict[str, Any]]  # rank -> inflight_live.json
    warnings: list[str] = field(default_factory=list)
    # Some node's manifest says running and its launcher is alive: the run is still being
    # written, whatever ``status`` (the worst node's) says already.
    writing: bool = False


class LiveReader:
    """Reads a run directory while the job writes it: each :meth:`poll` returns the
    rows appended since the previous one (see :class:`TableTail`) and the current
    manifest, statuses and live in-flight collectives. New rank and node directories
    are picked up as they appear; ``manifest.node<K>.json`` files are read as they are."""

    def __init__(
        self, run: str | os.PathLike[str], tail_bytes: dict[str, int] | None = None
    ) -> None:
        self.run = Path(run)
        if not is_dir(self.run):
            raise RunFormatError(f"{self.run}: not a directory")
        try:
            self._dir_id: tuple[int, int] | None = _dir_id(self.run)
        except OSError:
            self._dir_id = None
        self.tail_bytes = dict(LIVE_TAIL_BYTES if tail_bytes is None else tail_bytes)
        self._tails: dict[tuple[str, str, int], TableTail] = {}
        self._rank_info: dict[int, dict[str, Any]] = {}
        self._statuses: dict[int, dict[str, Any]] = {}
        self._inflight: dict[int, dict[str, Any]] = {}
        self._inflight_mtime: dict[int, int] = {}
        self._inflight_problem: dict[int, str] = {}  # rank -> why its file was unreadable
        self._clock: dict[int, int] = {}  # node -> offset to node 0 (node<K>/clock.json)

    def _clock_offsets(
        self, nodes: list[int], manifests: Mapping[int, Mapping[str, Any]]
    ) -> dict[int, int]:
        """Each node's clock offset, as the loader takes it (:func:`clock_offsets`): its
        manifest's ``clock``, else its ``node<K>/clock.json``; read again each poll until
        one holds a measurement (the launcher writes them after the rendezvous)."""
        for n in sorted(set(nodes) | set(manifests)):
            if n == 0 or n in self._clock:
                continue
            record = manifests.get(n, {}).get("clock")
            if not isinstance(record, dict) or "offset_ns" not in record:
                record = read_json(node_dir(self.run, n) / CLOCK)
            if isinstance(record, dict) and ("offset_ns" in record or "error" in record):
                offset = record.get("offset_ns")
                if isinstance(offset, int) and _is_int(offset):
                    self._clock[n] = offset if abs(offset) <= MAX_CLOCK_OFFSET_NS else 0
                else:
                    self._clock[n] = 0
        return {n: o for n, o in self._clock.items() if o}

    def _tail(self, kind: str, table: str, index: int) -> TableTail:
        key = (kind, table, index)
        tail = self._tails.get(key)
        if tail is None:
            base = rank_dir(self.run, index) if kind == "rank" else node_dir(self.run, index)
            tail = TableTail(table_path(base, table), self.tail_bytes.get(table))
            self._tails[key] = tail
        return tail

    def malformed_rows(self) -> int:
        return sum(t.malformed for t in self._tails.values())

    def poll(self) -> LiveBatch:
        """The new rows and current documents. Every file that is there but could not
        be read this time (and each table's malformed lines) is one line naming it in
        ``warnings``; the rest is read as usual."""
        warnings: list[str] = []
        lost = self._lost()
        if lost is not None:
            return self._lost_batch(*lost)
        manifest = read_json(self.run / MANIFEST, warnings)
        manifest = manifest if isinstance(manifest, dict) else {}
        statuses = [self._status(manifest, self.run / MANIFEST, warnings)] if manifest else []
        node_manifests: dict[int, dict[str, Any]] = {}
        names = list_dir(self.run, warnings) or ()
        for name in names:
            m = _NODE_MANIFEST_RE.match(name)
            extra = read_json(self.run / name, warnings) if m else None
            if m and isinstance(extra, dict):
                node_manifests[int(m.group(1))] = extra
                statuses.append(self._status(extra, self.run / name, warnings))
        status = _worst_status(statuses) if statuses else None
        by_node = dict(node_manifests)
        if manifest:
            by_node.setdefault(manifest_node(manifest), manifest)
        # a rank directory that cannot be listed is one line, not one per file in it
        ranks = [
            r
            for r in _rank_layout(self.run, names, warnings)[0]
            if not lexists(rank_dir(self.run, r))
            or list_dir(rank_dir(self.run, r), warnings) is not None
        ]
        for r in ranks:
            self._read_docs(r, warnings)
        rank_rows = {
            t: {r: self._tail("rank", t, r).read() for r in ranks} for t in LIVE_RANK_TABLES
        }
        nodes = list_nodes(self.run)
        node_rows = {t: {n: self._tail("node", t, n).read() for n in nodes} for t in NODE_TABLES}
        for tail in self._tails.values():
            for line in tail.problems:
                bad_input(warnings, line)
        offsets = self._clock_offsets(nodes, by_node)
        rank_offsets: dict[int, int] = {}
        if offsets:  # a multi-node run: every node's rows on node 0's clock
            for r, info in self._rank_info.items():
                node = info.get("node_rank")
                if isinstance(node, int) and offsets.get(node):
                    rank_offsets[r] = offsets[node]
            for table in rank_rows.values():
                for r, rows in table.items():
                    _shift_instants(rows, rank_offsets.get(r, 0))
            for table in node_rows.values():
                for n, rows in table.items():
                    _shift_instants(rows, offsets.get(n, 0))
        return LiveBatch(
            t_ns=time.time_ns(),
            status=status,
            manifest=manifest,
            node_manifests=node_manifests,
            hang_report=bool(hang_report_paths(self.run)),
            rank_rows=rank_rows,
            node_rows=node_rows,
            rank_info=_shifted_docs(self._rank_info, rank_offsets),
            statuses=_shifted_docs(self._statuses, rank_offsets),
            inflight=_shifted_docs(self._inflight, rank_offsets),
            warnings=warnings,
            writing="running" in statuses,
        )

    def _lost(self) -> tuple[str, str] | None:
        """(state, why) when the run directory can no longer be read at all: ``gone``
        (deleted, moved, or replaced by another directory or a file since the reader
        opened it) or ``unreadable`` (there, but it cannot be listed); else None."""
        try:
            ident = _dir_id(self.run)
            if ident is None:
                return "gone", "the run directory is gone (replaced by a file while watched)"
            os.listdir(self.run)
        except (FileNotFoundError, NotADirectoryError):
            return "gone", "the run directory is gone (deleted or moved while watched)"
        except (OSError, ValueError) as exc:
            return "unreadable", f"the run directory cannot be read any more ({read_problem(exc)})"
        if self._dir_id is not None and ident != self._dir_id:
            return "gone", "the run directory is gone (replaced by another directory while watched)"
        return None

    def _lost_batch(self, state: str, why: str) -> LiveBatch:
        """A poll of a run directory that is no more: ``state`` (not a run status: the
        run's own end is unknown), one line naming the directory, the documents read
        before; no new rows."""
        return LiveBatch(
            t_ns=time.time_ns(),
            status=state,
            manifest={},
            node_manifests={},
            hang_report=False,
            rank_rows={t: {} for t in LIVE_RANK_TABLES},
            node_rows={t: {} for t in NODE_TABLES},
            rank_info=dict(self._rank_info),
            statuses=dict(self._statuses),
            inflight={},
            warnings=[f"{self.run}: {why}"],
            writing=False,
        )

    @staticmethod
    def _status(manifest: dict[str, Any], path: Path, warnings: list[str]) -> str | None:
        """:func:`run_status`, and one line naming the manifest when its launcher record
        is one no launcher writes (a pid "123" or 1e300): that run is not running."""
        launcher = manifest.get("launcher")
        problem = None if launcher is None else launcher_pid_problem(launcher)
        if problem and manifest.get("status") == "running":
            bad_input(warnings, f"{path}: {problem}; the run is taken as not running")
        return run_status(manifest, path)

    def _read_docs(self, rank: int, warnings: list[str]) -> None:
        """rank_info until it names the backend, status.json until it exists, and
        inflight_live.json when its mtime changed: a few stats per rank per poll. A
        document that is there but unreadable is a line in ``warnings`` at every poll."""
        rdir = rank_dir(self.run, rank)
        info = self._rank_info.get(rank)
        if info is None or info.get("backend") is None:
            fresh = _live_doc(rdir / RANK_INFO, warnings)
            if fresh is not None:
                self._rank_info[rank] = fresh
        if rank not in self._statuses:
            status = _live_doc(rdir / STATUS, warnings)
            if status is not None:
                self._statuses[rank] = status
        path = rdir / LIVE_INFLIGHT
        try:
            mtime = os.stat(path).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            self._inflight_problem.pop(rank, None)
            return
        except OSError as exc:
            bad_input(warnings, f"{path}: {read_problem(exc)}")
            return
        if self._inflight_mtime.get(rank) != mtime:
            found: list[str] = []
            live = _live_doc(path, found)
            self._inflight_mtime[rank] = mtime  # read again only once it changes
            if live is not None:
                self._inflight[rank] = live
                self._inflight_problem.pop(rank, None)
            elif found:
                self._inflight_problem[rank] = found[0]
        if rank in self._inflight_problem:
            bad_input(warnings, self._inflight_problem[rank])


# What a live reader says of a run directory it can no longer read (beside RUN_STATUSES).
LIVE_LOST_STATES = ("gone", "unreadable")


def _dir_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory ``path``; None when it is no directory."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _live_doc(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    """A rank's small JSON document for a live reader: None when missing (not written
    yet) or unusable, the latter with one line naming it in ``warnings``."""
    obj = read_json(path, warnings)
    if obj is None or isinstance(obj, dict):
        return obj
    bad_input(warnings, f"{path}: not a JSON object; ignored")
    return None


# Instants of the live documents (inflight_live.json's entries) beside the tables' own.
_LIVE_INSTANTS = INSTANT_COLUMNS | {"enter_ns"}


def _shifted_docs(
    docs: Mapping[int, dict[str, Any]], offsets: Mapping[int, int]
) -> dict[int, dict[str, Any]]:
    """rank -> document, the instants of a rank on another node's clock (top level and
    in lists of entries) put on node 0's, in copies: the kept documents stay as read."""
    out = dict(docs)
    for rank, offset in offsets.items():
        doc = docs.get(rank)
        if doc is None or not offset:
            continue
        copy = {k: _shift_value(k, v, offset) for k, v in doc.items()}
        for key, value in doc.items():
            if isinstance(value, list):
                copy[key] = [
                    {k: _shift_value(k, v, offset) for k, v in e.items()}
                    if isinstance(e, dict)
                    else e
                    for e in value
                ]
        out[rank] = copy
    return out


def _shift_value(key: str, value: Any, offset: int) -> Any:
    return value + offset if key in _LIVE_INSTANTS and _is_int(value) else value


class JobLiveReader:
    """Reads the per-node run directories of one multi-node job while it runs (each
    launcher its own ``--out``), as one run: one :class:`LiveReader` per directory, so
    every table keeps its own remembered offset, and each poll's batches merged the way
    :func:`load_run` merges the directories (:func:`merge_manifests`, the worst node's
    status; ranks and nodes are disjoint, each node wrote its own, every node's rows
    already on node 0's clock).

    Given the parent of the directories, new node directories of the job are picked up
    as they appear (:func:`node_parts`, looked at every ``REDISCOVER_S``)."""

    REDISCOVER_S = 5.0

    def __init__(
        self,
        parts: Sequence[str | os.PathLike[str]],
        parent: str | os.PathLike[str] | None = None,
        tail_bytes: dict[str, int] | None = None,
    ) -> None:
        self.parent = Path(parent) if parent is not None else None
        self.tail_bytes = tail_bytes
        self.readers: dict[Path, LiveReader] = {}
        self._found_at = time.monotonic()  # the parts were just found
        for part in parts:
            self._add(Path(part))
        if not self.readers:
            raise RunFormatError(f"{parent}: no node directories")
        self.run = self.parent or Path(os.path.commonpath([str(p) for p in self.readers]))

    def _add(self, part: Path) -> None:
        if part not in self.readers:
            self.readers[part] = LiveReader(part, self.tail_bytes)

    @property
    def parts(self) -> list[Path]:
        return list(self.readers)

    def malformed_rows(self) -> int:
        return sum(r.malformed_rows() for r in self.readers.values())

    def poll(self) -> LiveBatch:
        now = time.monotonic()
        if self.parent is not None and now - self._found_at >= self.REDISCOVER_S:
            self._found_at = now
            for part in node_parts(self.parent):
                self._add(part)
        return merge_live_batches([r.poll() for r in self.readers.values()])


def merge_live_batches(batches: Sequence[LiveBatch]) -> LiveBatch:
    """One job's :class:`LiveBatch` from its nodes' directories' batches."""
    manifests: dict[int, dict[str, Any]] = {}
    for b in batches:
        if b.manifest:
            manifests.setdefault(manifest_node(b.manifest), b.manifest)
        for n, m in b.node_manifests.items():
            manifests.setdefault(n, m)
    merged = merge_manifests(sorted(manifests.items())) if manifests else {}
    first = min(manifests) if manifests else 0
    statuses = [b.status for b in batches if b.status is not None]

    def union(
        attr: str,
    ) -> dict[str, dict[int, list[dict[str, Any]]]]:
        out: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for b in batches:
            for table, rows in getattr(b, attr).items():
                out.setdefault(table, {}).update(rows)
        return out

    def docs(attr: str) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for b in batches:
            out.update(getattr(b, attr))
        return out

    status = _worst_status(statuses) if statuses else None
    if batches and all(b.status in LIVE_LOST_STATES for b in batches):
        status = min(str(b.status) for b in batches)  # every node directory: gone first
    return LiveBatch(
        t_ns=max(b.t_ns for b in batches),
        status=status,
        manifest=merged,
        node_manifests={n: m for n, m in manifests.items() if n != first},
        hang_report=any(b.hang_report for b in batches),
        rank_rows=union("rank_rows"),
        node_rows=union("node_rows"),
        rank_info=docs("rank_info"),
        statuses=docs("statuses"),
        inflight=docs("inflight"),
        warnings=[w for b in batches for w in b.warnings],
        writing=any(b.writing for b in batches),
    )


def open_live(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tail_bytes: dict[str, int] | None = None,
) -> LiveReader | JobLiveReader:
    """The live reader of a run as :func:`load_run` would read it: a run directory, the
    per-node directories of one job (a list of them, or a parent holding them, found
    and grouped as `gpudiag analyze` does: :func:`node_parts`, :func:`group_node_dirs`).
    Raises :class:`RunFormatError` (one line) for anything else."""
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        if len(paths) == 1:
            return open_live(paths[0], tail_bytes)
        for p in paths:
            if not is_run_dir(p):
                raise RunFormatError(f"{p}: not a gpudiag run directory")
        groups = group_node_dirs(paths)
        if len(groups) != 1:
            raise RunFormatError(
                f"{' '.join(map(str, paths))}: not the per-node directories of one job "
                "(one node each, the same job, at the same time)"
            )
        return JobLiveReader(groups[0], tail_bytes=tail_bytes)
    run = Path(path)
    parts = node_parts(run)
    if parts:
        return JobLiveReader(parts, parent=run, tail_bytes=tail_bytes)
    return LiveReader(run, tail_bytes)
