"""Safe, bounded file access: every run file is opened, sized, listed and decoded here,
so that whatever is on disk the result is the content or one warning line."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

from gpudiag.rundir.text import _LONE_SURROGATE, _short

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
# One table (JSON Lines) in all: the rows past it are not read. GPUDIAG_MAX_TABLE_BYTES
# overrides it; traces have their own limit (analysis/trace_files.py, DEFAULT_MAX_TRACE_BYTES).
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
