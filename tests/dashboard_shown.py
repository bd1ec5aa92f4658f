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


def url_errors(app: Any, timeout: int = 180, **params: str) -> list[str]:
    """The app at ``app`` opened with these URL query parameters: its error lines as
    plain text (it must raise nothing)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(app), default_timeout=timeout)
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return [e.value.replace("\\", "") for e in at.error]
