"""A table's rows turned into a DataFrame a block at a time (bounded memory)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable
from typing import Any


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


class Table:
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
