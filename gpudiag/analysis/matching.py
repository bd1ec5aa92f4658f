"""Collective calls matched across ranks: the k-th call of a process group on each
rank is one collective (by sequence number when every row of the group has one, else by
order within the group). The cross-rank analyses of calls (arrival skew, the wait for
peers) read every call of every rank; they take the calls a few whole matched groups at
a time, so that their work arrays are of a piece, not of the whole run (the client's
peak memory on a many-rank run)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

# Rows (calls of all ranks) taken at once by the cross-rank analyses of calls.
MATCH_CHUNK_ROWS = 1 << 16


def match_key(table: pd.DataFrame) -> pd.Series:
    """Per row: the seq when the whole group has one, else its index in the group."""
    has_seq = table["seq"].notna().groupby(table["pg_name"]).transform("all")
    seq = table["seq"].astype(float)
    return pd.Series(
        np.where(has_seq.to_numpy(), seq.to_numpy(), table["index"].to_numpy(dtype=float)),
        index=table.index,
    )


def match_group_chunks(
    table: pd.DataFrame, columns: list[str], rows: int | None = None
) -> Iterator[pd.DataFrame]:
    """``table``'s ``columns`` and its match ``key``, a few whole match groups (one
    (``pg_name``, key) each: a call matched across ranks) at a time, in (pg_name, key)
    order, each piece's rows in the table's order and indexed by their positions in it.
    An analysis of each group alone then needs work arrays of about ``rows`` rows, not
    of every call of every rank (``rows``: MATCH_CHUNK_ROWS)."""
    rows = rows or MATCH_CHUNK_ROWS
    key = match_key(table).to_numpy(dtype=float)
    codes, _ = pd.factorize(table["pg_name"], sort=True)
    if (codes < 0).any() or np.isnan(key).any() or len(table) <= rows:
        whole = table[columns].assign(key=key)  # rows no group would take: as one piece
        yield whole.set_axis(pd.RangeIndex(len(whole)))
        return
    order = np.lexsort((key, codes))
    ordered_codes, ordered_key = codes[order], key[order]
    new_group = np.flatnonzero(
        (ordered_codes[1:] != ordered_codes[:-1]) | (ordered_key[1:] != ordered_key[:-1])
    )
    bounds = np.concatenate(([0], new_group + 1, [len(order)]))
    del ordered_codes, ordered_key, new_group
    start = 0
    while start < len(order):
        # the first group boundary at least ``rows`` rows on (or the end)
        end = int(bounds[min(int(np.searchsorted(bounds, start + rows)), len(bounds) - 1)])
        at = np.sort(order[start:end])
        piece = {c: table[c].take(at).set_axis(at) for c in columns}  # these alone
        yield pd.DataFrame(piece).assign(key=key[at])
        start = end


def concat_pieces(pieces: Iterable[pd.DataFrame]) -> pd.DataFrame | None:
    """``pd.concat`` of the non-empty pieces (ignore_index; None when there is none),
    holding them apart by column: each piece's blocks are freed as it is taken and each
    column is joined alone, where ``pd.concat`` of frames holds every piece and the
    whole result at once."""
    names: list[str] | None = None
    parts: dict[str, list[pd.Series]] = {}
    for piece in pieces:
        if not len(piece):
            continue
        names = list(piece.columns) if names is None else names
        for name in names:
            parts.setdefault(name, []).append(piece[name].copy())
    if names is None:
        return None
    joined = {name: pd.concat(parts.pop(name), ignore_index=True) for name in names}
    return pd.DataFrame(joined, copy=False)
