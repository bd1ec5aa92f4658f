"""The collective wall time per step of a many-rank run is read a piece (whole ranks) at a
time from the spilled collective table, never as one frame of every call: the frame
took a 16,384-rank Megatron-shaped replay from 0.224 to 0.699 GiB (commit ac82875,
docs/cluster.md). Its rows are the whole table's, value for value."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd

from gpudiag.analysis import comms, pipeline
from gpudiag.analysis.spill import SpilledTable, SpillFile

CALLS_PER_RANK = 84  # astrasim_megatron_tp8's


def _rank_rows(rank: int) -> pd.DataFrame:
    rng = np.random.default_rng(rank % 8)
    n = CALLS_PER_RANK
    start = np.cumsum(rng.integers(1000, 10**6, n)).astype(np.int64)
    dur = rng.integers(100, 10**6, n)
    return pd.DataFrame(
        {
            "rank": np.full(n, rank, dtype=np.int64),
            "pg_name": "0",
            "op": np.where(np.arange(n) % 3, "all_reduce", "all_gather"),
            "bytes": rng.choice([8.0, 1024.0, 6.7e7], n),
            "start_ns": start,
            "end_ns": start + dur,
            "dur_ms": dur / 1e6,
            "step": (np.arange(n) // 42).astype(np.int32),
            "source": "trace:kernel",
        }
    )


def _table(ranks: int, per_piece: int) -> SpilledTable:
    """A spilled collective table of ``ranks`` ranks, ``per_piece`` whole ranks a piece
    (as comms.collective_pieces makes it)."""
    pieces = (
        pd.concat([_rank_rows(r) for r in range(lo, min(lo + per_piece, ranks))]).reset_index(
            drop=True
        )
        for lo in range(0, ranks, per_piece)
    )
    table = SpilledTable.build(pieces, SpillFile())
    assert table is not None and table.spilled
    return table


def test_wall_time_per_step_holds_a_piece_not_the_table() -> None:
    pipeline._collective_wall(_table(4, 2), comms, [])  # pandas' first-call allocations
    table = _table(256, 16)
    whole = int(table.frame().memory_usage(deep=True).sum())
    tracemalloc.start()
    try:
        got = pipeline._collective_wall(table, comms, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # before: the frame of every call and its copies, 4.1x the frame (8.1 MB of 2.0);
    # after: a piece and a few numbers per rank, 0.44x
    assert peak < whole, (peak, whole)
    want = comms.collective_wall_per_step(table.frame())
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got["ranks"]) == [256, 256]


def test_pieces_not_of_whole_ranks_are_read_as_one_table() -> None:
    table = pd.concat([_rank_rows(r) for r in range(6)], ignore_index=True)
    want = comms.collective_wall_per_step(table)
    halves = [table.iloc[::2].reset_index(drop=True), table.iloc[1::2].reset_index(drop=True)]
    got = comms.collective_wall_of_pieces(lambda: halves)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    by_rank = [g.reset_index(drop=True) for _, g in table.groupby("rank")][::-1]
    got = comms.collective_wall_of_pieces(lambda: by_rank)  # whole ranks, any order
    pd.testing.assert_frame_equal(got, want, check_exact=True)
