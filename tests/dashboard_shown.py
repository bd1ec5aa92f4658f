"""Reading a dashboard table back in AppTest, whichever widget draws it."""

from __future__ import annotations

from typing import Any

import pandas as pd


def _as_number(value: Any) -> Any:
    try:
        return float(str(value).replace("\\", ""))
    except ValueError:
        return value


def table_with(at: Any, header: str) -> pd.DataFrame:
    """The table of the page with column ``header``: a sortable ``st.dataframe``, or a
    table drawn whole (``st.table``, its numbers as text: read back as numbers)."""
    for element in at.dataframe:
        if header in element.value.columns:
            return element.value
    for element in at.table:
        if header in element.value.columns:
            return element.value.map(_as_number)
    raise AssertionError(f"no table with {header!r}")
