"""One way to write a number: the terminal report, the HTML report and the dashboard
all turn quantities into text here, so a value reads the same in each (two decimals
for milliseconds, one for percentages, byte counts in KiB/MiB/GiB, and every missing
value, None, NaN or infinite, as the same dash)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

NA = "–"  # None, NaN and inf: one dash everywhere
MS_DIGITS = 2
PCT_DIGITS = 1
_BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


# What a run's text must not send to a terminal: C0/C1 controls but newline and tab (ESC
# starts colour and cursor sequences) and the bidirectional overrides and isolates (they
# reorder what follows: U+202E made a message read backwards)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str) -> str:
    """``text`` from a run (an exception's message, an op name) safe to print: each
    unsafe character written as its escape (``\x1b``, ``\u202e``)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, NaN, inf, not a number)."""
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def num(value: Any, digits: int = MS_DIGITS) -> str:
    """A number with ``digits`` decimals (an integer without), or the dash."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    v = number(value)
    if v is None:
        return NA
    text = f"{v:.{digits}f}"
    return "0" + text[2:] if text.startswith("-0") and float(text) == 0 else text


def ms(value: Any, unit: str = "ms") -> str:
    """Milliseconds: ``39.05 ms`` (or ``39.05 ms/step`` with unit="ms/step")."""
    text = num(value)
    return text if text == NA else f"{text} {unit}"


def pct(value: Any, digits: int = PCT_DIGITS) -> str:
    """A percentage already in percent: ``76.0 %``."""
    text = num(value, digits)
    return text if text == NA else f"{text} %"


def share(value: Any, digits: int = 0) -> str:
    """A fraction (0..1) as a percentage: ``49 %``."""
    v = number(value)
    return NA if v is None else pct(100 * v, digits)


def size(value: Any) -> str:
    """A byte count in GiB, MiB or KiB (one decimal), or bytes."""
    v = number(value)
    if v is None:
        return NA
    for unit, div in _BYTE_UNITS:
        if abs(v) >= div:
            return f"{v / div:.1f} {unit}"
    return f"{v:.0f} B"


def ranks(values: Iterable[Any]) -> str:
    """``rank 2``, ``ranks 0 and 6``, ``ranks 0, 2 and 3``."""
    items = [str(int(v)) if number(v) is not None else str(v) for v in values]
    if not items:
        return "all ranks"
    if len(items) == 1:
        return f"rank {items[0]}"
    return f"ranks {', '.join(items[:-1])} and {items[-1]}"


def per_rank(values: Mapping[Any, Any], unit: str = "") -> str:
    """A per-rank mapping as a person reads it: ``rank 2: 39.05 ms, rank 0: 0.00 ms``."""
    tail = f" {unit}" if unit else ""
    parts = []
    for rank, value in values.items():
        text = num(value) if number(value) is not None or value is None else str(value)
        parts.append(f"rank {rank}: {text}{tail if text != NA else ''}")
    return ", ".join(parts)


def frame_text(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Every cell of ``frame`` as text through :func:`num` (columns named in ``digits``
    with their own decimals); text cells kept as they are."""
    digits = digits or {}
    out = frame.copy()
    for col in out.columns:
        d = digits.get(str(col), MS_DIGITS)
        out[col] = [c if isinstance(c, str) else num(c, d) for c in out[col].tolist()]
    return out.astype(object)


def styled(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> Any:
    """``frame`` for ``st.dataframe``: numbers stay numbers (the table sorts by value),
    shown through :func:`num` (so NaN is the dash, as everywhere else)."""
    digits = digits or {}

    def cell(d: int) -> Any:
        return lambda v: v if isinstance(v, str) else num(v, d)

    # a browser table draws a missing cell its own way ("None"): a column with one is
    # shown as text, so every missing value reads as the dash
    out = frame.copy()
    for col in out.columns:
        if out[col].isna().any():
            d = digits.get(str(col), MS_DIGITS)
            out[col] = [v if isinstance(v, str) else num(v, d) for v in out[col].tolist()]
    formats = {c: cell(digits.get(str(c), MS_DIGITS)) for c in out.columns}
    return out.style.format(formats, na_rep=NA)


__all__ = [
    "terminal_text",
    "MS_DIGITS",
    "NA",
    "PCT_DIGITS",
    "frame_text",
    "ms",
    "num",
    "number",
    "pct",
    "per_rank",
    "ranks",
    "share",
    "size",
    "styled",
]
