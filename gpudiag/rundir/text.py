"""Text and JSON encoding shared by the writers and the readers: one line per row,
file names that are not UTF-8, control characters kept out of a terminal."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- encoding


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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
