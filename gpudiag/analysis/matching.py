"""Collective calls matched across ranks: the k-th call of a process group on each
rank is one collective (by sequence number when every row of the group has one, else by
order within the group). The cross-rank analyses of calls (arrival skew, the wait for
peers) read every call of every rank; they take the calls a few whole matched groups at
a time, so that their work arrays are of a piece, not of the whole run (the client's
peak memory on a many-rank run). Where the table is on disk (spill.SpilledTable) the
calls are sorted into those pieces through the spill file (match_groups), and per-rank
sums of what was matched read it back a block of whole ranks at a time (rank_blocks):
one piece is in memory at a time."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pandas as pd

from gpudiag.analysis.spill import SpilledParts, SpilledTable, SpillFile

# Rows (calls of all ranks) taken at once by the cross-rank analyses of calls.
MATCH_CHUNK_ROWS = 1 << 16

Table: TypeAlias = pd.DataFrame | SpilledTable
# What a reader keeps of each piece before it is matched (a filter of its rows, types)
Prepare: TypeAlias = Callable[[pd.DataFrame], pd.DataFrame]
_KEY_READS = ("pg_name", "seq", "index")


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


def match_groups(
    table: Table,
    columns: Sequence[str],
    spill: SpillFile | None = None,
    rows: int | None = None,
    prepare: Prepare | None = None,
) -> Iterator[pd.DataFrame]:
    """:func:`match_group_chunks` of ``prepare`` of each of ``table``'s pieces (its
    rows: their positions among the rows kept), where the table is kept on disk: its
    calls are sorted into parts of about ``rows`` rows, whole match groups in (pg_name,
    key) order, through ``spill``; one part is in memory at a time, so the client's
    memory does not grow with the calls. In memory as one table where it is small, not
    on disk, or its pieces differ in dtypes (the whole table's dtypes would differ)."""
    rows = rows or MATCH_CHUNK_ROWS
    kept = SpilledTable.of_table(table)
    reads = list(dict.fromkeys([*columns, *_KEY_READS]))
    ready = prepare or (lambda piece: piece)
    plan = (
        _MatchPlan.of(ready(p) for p in kept.pieces(reads))
        if spill is not None and kept.spilled and len(kept) > rows and kept.uniform(reads)
        else None
    )
    parts = plan.sort(kept, reads, ready, spill, rows) if plan is not None and spill else None
    if parts is None:
        whole = [ready(p) for p in kept.pieces(reads)]
        frame = whole[0] if len(whole) == 1 else pd.concat(whole, ignore_index=True)
        yield from match_group_chunks(frame, list(columns), rows)
        return
    for index in range(len(parts)):
        part = parts.take(index)
        if part is not None:
            at = part.pop("at").to_numpy()
            yield part[[*columns, "key"]].set_axis(pd.Index(at))


@dataclass(frozen=True)
class _MatchPlan:
    """Per process group (sorted as pd.factorize sorts): whether its calls all have a
    seq, its calls and key range; from one pass over the pieces."""

    names: pd.Index
    all_seq: np.ndarray
    calls: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, pieces: Iterable[pd.DataFrame]) -> _MatchPlan | None:
        per_piece = []
        for piece in pieces:
            if not len(piece):
                continue
            if piece["pg_name"].isna().any():
                return None  # rows no group would take: the table as one piece
            seq = piece["seq"].astype(float)
            frame = pd.DataFrame(
                {
                    "pg": piece["pg_name"].to_numpy(),
                    "has": seq.notna().to_numpy(),
                    "seq": seq.to_numpy(),
                    "index": piece["index"].to_numpy(dtype=float),
                }
            )
            g = frame.groupby("pg", sort=False)
            per_piece.append(
                pd.DataFrame(
                    {
                        "has": g["has"].all(),
                        "calls": g.size(),
                        "seq_lo": g["seq"].min(),
                        "seq_hi": g["seq"].max(),
                        "index_lo": g["index"].min(),
                        "index_hi": g["index"].max(),
                        "index_nan": g["index"].count() < g.size(),
                    }
                )
            )
        if not per_piece:
            return None
        g = pd.concat(per_piece).groupby(level=0, sort=False)
        names = pd.Index(pd.factorize(pd.Index(g.size().index), sort=True)[1])
        agg = pd.DataFrame(
            {
                "has": g["has"].all(),
                "calls": g["calls"].sum(),
                "seq_lo": g["seq_lo"].min(),
                "seq_hi": g["seq_hi"].max(),
                "index_lo": g["index_lo"].min(),
                "index_hi": g["index_hi"].max(),
                "index_nan": g["index_nan"].any(),
            }
        ).reindex(names)
        has = agg["has"].to_numpy(dtype=bool)
        if (agg["index_nan"].to_numpy(dtype=bool) & ~has).any():
            return None  # a key is missing: the table as one piece
        return cls(
            names=names,
            all_seq=has,
            calls=agg["calls"].to_numpy(dtype=np.int64),
            low=np.where(has, agg["seq_lo"], agg["index_lo"]).astype(float),
            high=np.where(has, agg["seq_hi"], agg["index_hi"]).astype(float),
        )

    def sort(
        self, table: SpilledTable, reads: list[str], ready: Prepare, spill: SpillFile, rows: int
    ) -> SpilledParts:
        """The prepared rows of ``table`` with their ``key`` and position (``at``),
        sorted into parts: groups taken in order until a part has ``rows`` calls, a
        group of more calls cut by key ranges of about ``rows`` calls each."""
        first, bins, width = self._parts(rows)
        parts = SpilledParts(int((first + bins).max()) if len(first) else 0, spill)
        at = 0
        for piece in table.pieces(reads):
            piece = ready(piece)
            code = self.names.get_indexer(piece["pg_name"])
            key = np.where(
                self.all_seq[code],
                piece["seq"].astype(float).to_numpy(),
                piece["index"].to_numpy(dtype=float),
            )
            bin_of = np.floor((key - self.low[code]) / width[code])
            part = first[code] + np.clip(np.nan_to_num(bin_of), 0, bins[code] - 1).astype(np.int64)
            positions = np.arange(at, at + len(piece))
            parts.add(piece.reset_index(drop=True).assign(key=key, at=positions), part)
            at += len(piece)
        return parts

    def _parts(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group: its first part, how many parts it is cut into, their key width."""
        n = len(self.names)
        first = np.zeros(n, dtype=np.int64)
        bins = np.ones(n, dtype=np.int64)
        width = np.ones(n, dtype=float)
        part, held = 0, 0
        for g in range(n):
            calls = int(self.calls[g])
            if calls > rows:  # alone, cut by key
                part += 1 if held else 0
                held = 0
                bins[g] = math.ceil(calls / rows)
                width[g] = max((self.high[g] - self.low[g] + 1) / bins[g], 1e-300)
                first[g] = part
                part += int(bins[g])
                continue
            if held and held + calls > rows:
                part, held = part + 1, 0
            first[g] = part
            held += calls
        return first, bins, width


def rank_blocks(
    table: Table, columns: Sequence[str], spill: SpillFile | None = None, rows: int | None = None
) -> Iterator[pd.DataFrame]:
    """``table``'s ``columns`` a block of whole ranks at a time (key_blocks by rank): a
    per-rank analysis of rows in another order (the matched calls') then holds one
    block at a time."""
    return key_blocks(table, columns, ("rank",), spill, rows)


def key_blocks(
    table: Table,
    columns: Sequence[str],
    keys: Sequence[str],
    spill: SpillFile | None = None,
    rows: int | None = None,
) -> Iterator[pd.DataFrame]:
    """``table``'s ``columns`` a block of whole groups of ``keys`` at a time: groups in sorted order (as ``groupby(keys, sort=True)``) taken until a block
    has about ``rows`` rows, each block's rows in the table's order, sorted into blocks
    through ``spill`` where the table is kept on disk. In memory as one block where the
    table is small, not on disk, its pieces differ in dtypes or a key is missing."""
    rows = rows or MATCH_CHUNK_ROWS
    kept = SpilledTable.of_table(table)
    reads = list(dict.fromkeys([*columns, *keys]))
    plan = (
        _key_block_plan(kept.pieces(reads), list(keys), rows)
        if spill is not None and kept.spilled and len(kept) > rows and kept.uniform(reads)
        else None
    )
    if plan is None or spill is None:
        if len(kept):
            whole = list(kept.pieces(columns))
            yield whole[0] if len(whole) == 1 else pd.concat(whole, ignore_index=True)
        return
    groups, block = plan
    parts = SpilledParts(int(block.max()) + 1, spill)
    for piece in kept.pieces(reads):
        parts.add(piece[list(columns)], block[groups.get_indexer(_keys_of(piece, keys))])
    for index in range(len(parts)):
        part = parts.take(index)
        if part is not None:
            yield part


def _keys_of(frame: pd.DataFrame, keys: Sequence[str]) -> pd.Index:
    if len(keys) == 1:
        return pd.Index(frame[keys[0]])
    return pd.MultiIndex.from_frame(frame[list(keys)])


def _key_block_plan(
    pieces: Iterable[pd.DataFrame], keys: list[str], rows: int
) -> tuple[pd.Index, np.ndarray] | None:
    """(the groups of ``keys`` in sorted order, each one's block); None where a key is
    missing (groupby would drop its rows)."""
    sizes = group_sizes(pieces, keys)
    if sizes is None:
        return None
    return sizes.index, greedy_blocks(sizes.to_numpy(dtype=np.int64), rows)


def group_sizes(pieces: Iterable[pd.DataFrame], keys: Sequence[str]) -> pd.Series | None:
    """The rows of each group of ``keys`` over the pieces, in sorted order (as
    ``groupby(keys, sort=True)``); None where there is no row or a key is missing."""
    by = list(keys) if len(keys) > 1 else keys[0]
    sizes: pd.Series | None = None
    for piece in pieces:
        if piece[list(keys)].isna().to_numpy().any():
            return None
        seen = piece.groupby(by, sort=True).size()
        sizes = seen if sizes is None else sizes.add(seen, fill_value=0)
    if sizes is None or not len(sizes):
        return None
    return sizes.sort_index()


def greedy_blocks(sizes: np.ndarray, rows: int) -> np.ndarray:
    """Each group's block: groups taken in order until a block would pass ``rows``
    rows (a larger group is a block alone)."""
    block = np.zeros(len(sizes), dtype=np.int64)
    current, held = 0, 0
    for i, n in enumerate(sizes):
        if held and held + n > rows:
            current, held = current + 1, 0
        block[i] = current
        held += int(n)
    return block
