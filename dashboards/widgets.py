"""The dashboard's table and text widgets: every run-derived string escaped (:func:`md`),
every number through the one formatter (:mod:`gpudiag.report.numbers`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from gpudiag.report import numbers

# Every ASCII punctuation character may be backslash-escaped in (GitHub-flavoured)
# Markdown; escaping them all leaves no link, image, code span, emphasis, HTML, math
# ($), directive (:red[...]) or block syntax in run-derived text.
_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def md(value: Any) -> str:
    """``value`` as Markdown that renders literally, on one line."""
    text = " ".join(str(value).split())
    return _MD_SPECIAL.sub(r"\\\1", text)


def scalar(value: Any) -> str:
    """A fact or a metric's value: numbers through the one formatter, one dash for none."""
    if isinstance(value, (int, float)):
        return numbers.num(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else numbers.NA
    return numbers.NA if value is None or value == "" else str(value)


def metrics(facts: dict[str, Any]) -> None:
    """Label -> value as metrics, four to a row (values escaped: metrics render Markdown)."""
    items = list(facts.items())
    for start in range(0, len(items), 4):
        row = items[start : start + 4]
        for col, (label, value) in zip(st.columns(len(row)), row, strict=True):
            col.metric(label, md(scalar(value)))


def dataframe(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> None:
    """A sortable table through the one number formatter (:func:`numbers.styled`). A
    number column with a missing cell is sent as text (so the cell reads ``–``): it is
    kept right-aligned as the other number columns (Compare's B columns were
    left-aligned beside the A columns: probe 31f, D11)."""
    right = st.column_config.Column(alignment="right")
    st.dataframe(
        numbers.styled(frame, digits),
        width="stretch",
        hide_index=True,
        column_config={str(c): right for c in numbers.numbers_as_text(frame)},
    )


def table(frame: pd.DataFrame) -> None:
    """A static table whose long text wraps instead of being cut off; every cell is
    escaped (``st.table`` renders cells as Markdown)."""
    st.table(frame.map(md), hide_index=True)


# A table of more rows than this stays sortable (st.dataframe) with a line saying that
# it scrolls sideways; fewer rows are drawn whole, their headers wrapped.
WHOLE_TABLE_MAX_ROWS = 32
# st.dataframe sizes each column to its header: more characters of headers than this do
# not fit the wide layout at 1440 px (probe 31g: the per-rank table showed 8 of its 13
# columns; rank 2's 40.83 ms of data loading only after a sideways scroll)
FITS_HEADER_CHARS = 130


def wide_dataframe(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> None:
    """A table of many columns that shows every column: whole, its headers wrapped
    (``st.table``), when it has a few rows and its headers would not fit; else sortable
    with a line naming the columns a sideways scroll shows."""
    header_chars = sum(len(str(c)) + 4 for c in frame.columns)
    if header_chars <= FITS_HEADER_CHARS:
        dataframe(frame, digits)
    elif len(frame) <= WHOLE_TABLE_MAX_ROWS:
        text = numbers.frame_text(frame, digits)
        right = [c for c in frame.columns if _number_column(frame[c])]
        for column in text.columns:  # numbers as the formatter wrote them, text escaped
            if column not in right:
                text[column] = text[column].map(md)
        styler = text.rename(columns=_header).style.hide(axis="index")
        st.table(
            styler.set_properties(subset=[_header(c) for c in right], **{"text-align": "right"})
        )
    else:
        dataframe(frame, digits)
        st.caption(md(f"{len(frame.columns)} columns: scroll the table sideways for the last ones"))


# a header of words, units and numbers renders as itself; another is escaped
_PLAIN_HEADER = re.compile(r"[\w %/().,+\-–−·]*")


def _header(name: Any) -> str:
    text = str(name)
    return text if _PLAIN_HEADER.fullmatch(text) else md(text)


def _number_column(column: pd.Series) -> bool:
    values = [v for v in column.tolist() if v is not None and not (isinstance(v, str) and not v)]
    return bool(values) and all(numbers.number(v) is not None for v in values)
