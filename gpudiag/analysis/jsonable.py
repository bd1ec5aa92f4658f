"""Analysis values as JSON-ready Python: the one conversion every JSON output goes through."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Rows of a frame converted at a time by `record_rows`.
_ROWS_AT_A_TIME = 1024


class Rows(list[Any]):
    """A JSON list whose items are made only as they are written: a per-rank list of a
    many-rank run is never held whole as Python objects (65,536 ranks: ~1.7 kB of dicts
    and floats per rank for the ``ranks`` list alone). It is a list for json's encoder
    with an indent (jsonout's), which iterates a list it encodes and asks only its
    length: one encoder writes it an item at a time. (The C encoder, used without an
    indent, would read it as the empty list it is underneath.) :func:`whole` makes it a
    plain list."""

    def __init__(self, make_items: Callable[[], Iterable[Any]], count: int) -> None:
        super().__init__()
        self._make_items = make_items
        self._count = count

    def __iter__(self) -> Iterator[Any]:
        return iter(self._make_items())

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0


def rows_of(items: Sequence[Any], convert: Callable[[Any], Any]) -> Rows:
    """``[convert(item) for item in items]``, made as it is written."""
    return Rows(lambda: (convert(item) for item in items), len(items))


def record_rows(frame: pd.DataFrame | None) -> Rows:
    """:func:`records` of ``frame``, made as it is written, a slice of rows at a time."""
    if frame is None or frame.empty:
        return Rows(tuple, 0)
    table = frame

    def make() -> Iterator[Any]:
        for start in range(0, len(table), _ROWS_AT_A_TIME):
            yield from records(table.iloc[start : start + _ROWS_AT_A_TIME])

    return Rows(make, len(table))


def whole(value: Any) -> Any:
    """``value`` with every :class:`Rows` in it made into a list."""
    if isinstance(value, Rows):
        return [whole(v) for v in value]
    if isinstance(value, dict):
        return {k: whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """Any nested value as JSON-ready Python (NaN/inf -> None, numpy -> Python); a
    :class:`Rows` stays one, its items converted as they are made."""
    if isinstance(value, Rows):
        rows = value
        return Rows(lambda: (plain(v) for v in rows), len(rows))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return records(value)
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def records(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    if frame is None or frame.empty:
        return []
    return [plain(r) for r in frame.to_dict(orient="records")]
