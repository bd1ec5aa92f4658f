"""One way to write a number: the terminal report, the HTML report and the dashboard
all turn quantities into text here, so a value reads the same in each (two decimals
for milliseconds, one for percentages, byte counts in KiB/MiB/GiB, and every missing
value, None, NaN or infinite, as the same dash)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.numfmt import MS_DIGITS, PCT_DIGITS, fixed

NA = "–"  # None, NaN and inf: one dash everywhere
S_DIGITS = 1  # seconds (since the last step, a collective's wait): one decimal
# A count per step or per rank (calls/rank, syncs per step, buckets per step): a whole
# number without decimals, a mean that is not whole with MS_DIGITS. Given as a column's
# "digits" (tables) or through :func:`count`; before, one kind of quantity read "6.0",
# "93.00" and "2.00" in three places (probe 31f, D7).
COUNT_DIGITS = -1
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
    if value is None or isinstance(value, (bool, np.bool_, str)):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def num(value: Any, digits: int = MS_DIGITS) -> str:
    """A number with ``digits`` decimals (an integer without), or the dash;
    ``digits=COUNT_DIGITS``: :func:`count`."""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    v = number(value)
    if v is None:
        return NA
    if digits == COUNT_DIGITS:
        return count(v)
    return fixed(v, digits)


def count(value: Any, digits: int = MS_DIGITS) -> str:
    """A count, or a mean count per step or rank: ``93`` when whole (``93.0`` too), else
    ``2.50`` with ``digits`` decimals; the dash when missing."""
    v = number(value)
    if v is None:
        return num(value)
    if v == round(v):
        return str(int(round(v)))
    return fixed(v, MS_DIGITS if digits == COUNT_DIGITS else digits)


def ms(value: Any, unit: str = "ms") -> str:
    """Milliseconds: ``39.05 ms`` (or ``39.05 ms/step`` with unit="ms/step")."""
    text = num(value)
    return text if text == NA else f"{text} {unit}"


def pct(value: Any, digits: int = PCT_DIGITS) -> str:
    """A percentage already in percent: ``76.0 %``."""
    text = num(value, digits)
    return text if text == NA else f"{text} %"


def share(value: Any, digits: int = PCT_DIGITS) -> str:
    """A fraction (0..1) as a percentage: ``49.0 %``."""
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


ALL_RANKS = "all ranks"  # a finding or fix that names no rank, in every report


def rank_cell(values: Iterable[Any]) -> str:
    """A rank list for a table cell: ``0, 2, 3``, or ``all ranks`` for none named."""
    return ", ".join(str(v) for v in values) or ALL_RANKS


NO_RANK = "no rank"  # a failure that names no rank: the job failed to launch


def finding_ranks_named(kind: str, values: Iterable[Any]) -> str:
    """:func:`ranks` of a finding's ranks; a failure that names none is the launch's
    (no rank started, probe 28j F6), ``no rank``, not ``all ranks``."""
    values = list(values)
    return NO_RANK if not values and kind == "rank_failed" else ranks(values)


def ranks(values: Iterable[Any]) -> str:
    """``rank 2``, ``ranks 0 and 6``, ``ranks 0, 2 and 3``."""
    items = [str(int(v)) if number(v) is not None else str(v) for v in values]
    if not items:
        return ALL_RANKS
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


def digits_for(header: Any) -> int:
    """The decimals of a table column, by the unit its header names: a percentage
    (``overlap % of comm``, ``B − A %``) :data:`PCT_DIGITS`, seconds (``waiting s``)
    :data:`S_DIGITS`, a count per step with no other unit (``syncs per step``; times are
    ``ms/step``) :data:`COUNT_DIGITS`, every other quantity (ms, ms/step, MiB, GB/s, W)
    :data:`MS_DIGITS`. Integers print without decimals whatever the column (:func:`num`)."""
    text = f" {header} ".replace("(", " ").replace(")", " ")
    if text.endswith(" per step "):
        return COUNT_DIGITS
    if " % " in text:
        return PCT_DIGITS
    return S_DIGITS if " s " in text else MS_DIGITS


def cell_text(value: Any, digits: int) -> str:
    """One table cell as text: a number through :func:`num`, a blank or missing cell the
    dash, other text as it is."""
    if isinstance(value, str):
        return value if value.strip() else NA
    return num(value, digits)


def _digits(frame: pd.DataFrame, digits: Mapping[str, int] | None) -> dict[Any, int]:
    given = digits or {}
    return {col: given.get(str(col), digits_for(col)) for col in frame.columns}


def frame_text(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Every cell of ``frame`` as text through :func:`cell_text`: decimals by each
    column's unit (:func:`digits_for`) unless ``digits`` names the column."""
    out = frame.copy()
    for col, d in _digits(frame, digits).items():
        out[col] = [cell_text(c, d) for c in out[col].tolist()]
    return out.astype(object)


def _missing(column: pd.Series) -> bool:
    if bool(column.isna().any()):
        return True
    return any(isinstance(v, str) and not v.strip() for v in column.tolist())


def numbers_as_text(frame: pd.DataFrame) -> list[Any]:
    """The columns of ``frame`` that hold numbers and that :func:`styled` sends as text
    (a missing cell among them): a view keeps them right-aligned like the others."""
    out = []
    for col in frame.columns:
        values = frame[col].tolist()
        held = [v for v in values if not (isinstance(v, str) or v is None)]
        if not _missing(frame[col]) or not held:
            continue
        if all(number(v) is not None or isinstance(v, float) for v in held):
            out.append(col)
    return out


def styled(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> Any:
    """``frame`` for ``st.dataframe``: numbers stay numbers (the table sorts by value),
    shown through :func:`cell_text` with the decimals of :func:`frame_text` (so NaN,
    None and a blank cell are the dash, as everywhere else)."""
    places = _digits(frame, digits)

    def cell(d: int) -> Any:
        return lambda v: cell_text(v, d)

    # a browser table draws a missing cell its own way ("None"): a column with one is
    # shown as text, so every missing value reads as the dash
    out = frame.copy()
    for col, d in places.items():
        if _missing(out[col]):
            out[col] = [cell_text(v, d) for v in out[col].tolist()]
    formats = {c: cell(places[c]) for c in out.columns}
    return out.style.format(formats, na_rep=NA)


__all__ = [
    "ALL_RANKS",
    "NO_RANK",
    "finding_ranks_named",
    "COUNT_DIGITS",
    "count",
    "rank_cell",
    "terminal_text",
    "MS_DIGITS",
    "cell_text",
    "digits_for",
    "NA",
    "PCT_DIGITS",
    "S_DIGITS",
    "frame_text",
    "numbers_as_text",
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
