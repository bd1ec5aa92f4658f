"""The call store: a run's per-call collective rows in an embedded database (DuckDB).

A many-rank run has more collective calls than the client should hold (1.38 M at 16,384
Megatron-shaped ranks). The rows are inserted a piece at a time as the collective table is
made (:meth:`CallStore.keeping`); DuckDB holds at most :data:`MEMORY_LIMIT` of them and
writes the rest to a directory in ``TMPDIR``. Each question is one SQL query over the
``calls`` table that returns a small result (comms.collective_summary,
whatif.last_bucket_ms). One thread: the rows are read in the order they came, and ``added``
numbers them in that order. docs/architecture.md, "The store".

Exactness, as pandas computes it on the whole table: a total is ``fsum`` (the correctly
rounded sum, whatever the order of the rows); a median is :func:`median_sql`'s.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import duckdb
import pandas as pd

from gpudiag.analysis.spill import SpilledTable

# The columns of the collective table kept in the store, with their SQL types
CALL_COLUMNS: dict[str, str] = {
    "rank": "BIGINT",
    "pg_name": "VARCHAR",
    "pg_size": "DOUBLE",
    "index": "BIGINT",
    "op": "VARCHAR",
    "bytes": "DOUBLE",
    "start_ns": "DOUBLE",
    "end_ns": "DOUBLE",
    "dur_ms": "DOUBLE",
    "busbw_gbs": "DOUBLE",
    "peak_gbs": "DOUBLE",
    "step": "DOUBLE",
    "source": "VARCHAR",
}
# What DuckDB may hold in memory before it writes to its temporary directory
MEMORY_LIMIT = "128MB"


class CallStore:
    """One analysis' collective calls, table ``calls``: :data:`CALL_COLUMNS` and ``added``,
    each row's position in the order the rows were added."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="gpudiag-store-")
        # removed by close(), else when the store is collected or at exit (a failed start)
        self._removed = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._db = duckdb.connect(
            ":memory:",  # past its memory limit, its rows and sorts go to temp_directory
            config={
                "threads": 1,
                "memory_limit": MEMORY_LIMIT,
                "temp_directory": self._dir,
            },
        )
        self._db.execute("SET enable_progress_bar = false")  # on stdout: the JSON report's
        columns = ", ".join(f'"{name}" {kind}' for name, kind in CALL_COLUMNS.items())
        self._db.execute(f"CREATE TABLE calls (added BIGINT, {columns})")
        self.rows = 0

    @classmethod
    def of(cls, table: pd.DataFrame | SpilledTable) -> CallStore:
        """A store of ``table``'s rows (a collective table in memory or on disk)."""
        store = cls()
        kept = SpilledTable.of_table(table)
        reads = [name for name in CALL_COLUMNS if name in kept.columns]
        for piece in kept.pieces(reads):
            store.add(piece)
        return store

    def add(self, piece: pd.DataFrame) -> None:
        """Insert the rows of ``piece`` (a missing column: NULL; NaN: NULL)."""
        if not len(piece):
            return
        columns = {
            name: piece[name] if name in piece else pd.Series(None, index=piece.index)
            for name in CALL_COLUMNS
        }
        rows = pd.DataFrame(columns).reset_index(drop=True)
        rows.insert(0, "added", range(self.rows, self.rows + len(rows)))
        self._db.register("piece", rows)
        try:
            reads = ", ".join(f'CAST("{n}" AS {k})' for n, k in CALL_COLUMNS.items())
            self._db.execute(f"INSERT INTO calls SELECT added, {reads} FROM piece")
        finally:
            self._db.unregister("piece")
        self.rows += len(rows)

    def clear(self) -> None:
        self._db.execute("DELETE FROM calls")
        self.rows = 0

    def keeping(self, pieces: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """The pieces as they come, each one added to the store first."""
        for piece in pieces:
            self.add(piece)
            yield piece

    def query(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        """The result of one query (small: the questions' answers, not calls)."""
        return self._db.execute(sql, params or []).df()

    def close(self) -> None:
        self._db.close()
        self._removed()

    def __enter__(self) -> CallStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def median_sql(source: str, keys: list[str], value: str) -> str:
    """A query of the median of ``value`` per ``keys`` over ``source`` (a table or a
    query), NULLs skipped, as pandas makes it: the middle of the sorted values, or
    ``(lo + hi) / 2`` of the two middle ones (DuckDB's ``median`` interpolates
    ``lo + (hi - lo) / 2``, another last digit). A window sort, which DuckDB spills to
    disk: a holistic aggregate of one large group holds all its values."""
    by = ", ".join(keys)
    return f"""
        SELECT {by},
            CASE WHEN max(n) % 2 = 1 THEN max(v) FILTER (WHERE i = n // 2 + 1)
                 ELSE (max(v) FILTER (WHERE i = n // 2) + max(v) FILTER (WHERE i = n // 2 + 1)) / 2
            END AS median
        FROM (
            SELECT {by}, {value} AS v,
                row_number() OVER (PARTITION BY {by} ORDER BY {value}) AS i,
                count(*) OVER (PARTITION BY {by}) AS n
            FROM ({source}) WHERE {value} IS NOT NULL
        )
        WHERE i = n // 2 OR i = n // 2 + 1
        GROUP BY {by}
    """
