"""The dashboard's table and text widgets: every run-derived string escaped (:func:`md`),
every number through the one formatter (:mod:`gpudiag.report.numbers`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from gpudiag.numfmt import plural
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


# How wide a table may be and still show every column in a 1280 px window: the wide
# layout's main column holds 818 px of table beside the sidebar there, 786 inside an
# expander (measured in headless Chromium; 978 at 1440 px). A table wider than this gets
# a line saying it scrolls sideways and naming the columns then off-screen (probe D7: the
# per-rank, collectives, straggler and GPU tables hid columns with no hint).
NARROW_WINDOW_PX = 1280
FITS_PX = 780
# st.dataframe sizes a column to its header or its widest cell: px per character and the
# padding of each, fitted to the widths Chromium drew of four tables (within 2 %)
_GRID_CHAR_PX = 5.9
_GRID_HEADER_PAD_PX = 14
_GRID_CELL_PAD_PX = 34
_CHAR_PX = 7.2  # st.table: the page's 14 px font, an average glyph (measured in Chromium)
_GRID_MIN_PX, _GRID_MAX_PX = 50, 500  # st.dataframe's own bounds of a sized column
_TABLE_PAD_PX = 12  # st.table: a cell's padding
_SAMPLE_ROWS = 200  # rows a width is estimated from (st.dataframe measures its first too)
# st.table, drawn a size smaller: the per-rank table of 13 columns fits a 1280 px window
_COMPACT = [{"selector": "th, td", "props": "font-size: 0.8rem; padding: 0.25rem 0.4rem;"}]
_COMPACT_SCALE = 0.8


def grid_widths(text: pd.DataFrame) -> list[float]:
    """Each column's width in px as ``st.dataframe`` sizes it: its header or its widest
    cell (the cells as the formatter writes them), within the grid's bounds."""
    widths = []
    for column in text.columns:
        cells = [str(v) for v in text[column].head(_SAMPLE_ROWS).tolist()]
        header = len(str(column)) * _GRID_CHAR_PX + _GRID_HEADER_PAD_PX
        cell = max(map(len, cells), default=0) * _GRID_CHAR_PX + _GRID_CELL_PAD_PX
        widths.append(min(max(header, cell, _GRID_MIN_PX), _GRID_MAX_PX))
    return widths


def table_widths(text: pd.DataFrame, scale: float = 1.0) -> list[float]:
    """Each column's narrowest width in px in ``st.table``, which wraps headers and
    cells at spaces: its longest word."""
    widths = []
    for column in text.columns:
        cells = [str(v) for v in text[column].head(_SAMPLE_ROWS).tolist()]
        words = [w for t in [str(column), *cells] for w in t.split()] or [""]
        widths.append(max(map(len, words)) * _CHAR_PX * scale + _TABLE_PAD_PX)
    return widths


def scroll_note(columns: list[Any], widths: list[float], budget: float = FITS_PX) -> str | None:
    """The line under a table wider than ``budget``: that it scrolls sideways in a
    window narrower than about N px, and which columns are then off-screen; None when
    it fits a 1280 px window."""
    total = sum(widths)
    if total <= budget:
        return None
    hidden, used = [], 0.0
    for column, width in zip(columns, widths, strict=True):
        used += width
        if used > budget:
            hidden.append(str(column))
    window = int(-(-(total + NARROW_WINDOW_PX - budget) // 10) * 10)
    names = "; ".join(hidden)
    return (
        f"Wider than the page in a window under about {window:,} px: scroll the table "
        f"sideways for its last {plural(len(hidden), 'column')} ({names})."
    )


def show_table(
    frame: pd.DataFrame, digits: Mapping[str, int] | None = None, *, draw: str = "grid"
) -> None:
    """The one way a view draws a table: every number through the one formatter, run
    text escaped, and a caption when it is wider than a 1280 px window can show
    (:func:`scroll_note`). ``draw``: ``grid``, sortable (``st.dataframe``); ``whole``,
    every row (``st.table``, headers and cells wrapped, a size smaller when that makes
    it fit); ``fit``, whole when it has a few rows and would not fit as a grid."""
    text = numbers.frame_text(frame, digits)
    grid = grid_widths(text)
    if draw == "fit":
        few = len(frame) <= WHOLE_TABLE_MAX_ROWS
        draw = "whole" if few and sum(grid) > FITS_PX else "grid"
    if draw == "grid":
        _grid(frame, digits)
        note = scroll_note(list(frame.columns), grid)
    else:
        compact = sum(table_widths(text)) > FITS_PX
        _whole(frame, text, compact)
        scale = _COMPACT_SCALE if compact else 1.0
        note = scroll_note(list(frame.columns), table_widths(text, scale))
    if note:
        st.caption(md(note))


def _grid(frame: pd.DataFrame, digits: Mapping[str, int] | None) -> None:
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


def _whole(frame: pd.DataFrame, text: pd.DataFrame, compact: bool) -> None:
    """Every row, headers and long text wrapped (``st.table``); numbers right-aligned
    as the formatter wrote them, every other cell escaped (``st.table`` renders cells
    as Markdown)."""
    right = [c for c in frame.columns if _number_column(frame[c])]
    text = text.copy()
    for column in text.columns:
        if column not in right:
            text[column] = text[column].map(md)
    styler = text.rename(columns=_header).style.hide(axis="index")
    styler = styler.set_properties(subset=[_header(c) for c in right], **{"text-align": "right"})
    st.table(styler.set_table_styles(_COMPACT) if compact else styler)


def dataframe(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> None:
    """A sortable table (:func:`show_table`)."""
    show_table(frame, digits)


def table(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> None:
    """A static table whose long text wraps instead of being cut off (:func:`show_table`)."""
    show_table(frame, digits, draw="whole")


# A table of more rows than this stays sortable (st.dataframe), with the line saying that
# it scrolls sideways when it does; fewer rows of a table too wide for a grid are drawn
# whole, their headers wrapped.
WHOLE_TABLE_MAX_ROWS = 32


def wide_dataframe(frame: pd.DataFrame, digits: Mapping[str, int] | None = None) -> None:
    """A table of many columns (:func:`show_table`: whole when few rows, else a grid)."""
    show_table(frame, digits, draw="fit")


# a header of words, units and numbers renders as itself; another is escaped
_PLAIN_HEADER = re.compile(r"[\w %/().,+\-–−·]*")


def _header(name: Any) -> str:
    text = str(name)
    return text if _PLAIN_HEADER.fullmatch(text) else md(text)


def _number_column(column: pd.Series) -> bool:
    values = [v for v in column.tolist() if v is not None and not (isinstance(v, str) and not v)]
    return bool(values) and all(numbers.number(v) is not None for v in values)
