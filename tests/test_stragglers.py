"""Stragglers on the real 8-rank GPU sets (timestamps line up across ranks, SOURCES.md)
and on constructed arrival tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis import comms, stragglers
from gpudiag.analysis.breakdown import run_breakdown
from gpudiag.analysis.ingest import find_traces, load_traces


def _analyse(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    traces = load_traces(find_traces(path), warnings=[])
    skew = stragglers.arrival_skew(comms.collective_table(traces))
    return skew, stragglers.stragglers(skew, run_breakdown(traces))


def test_megatron_names_ranks_0_and_6(shared_traces: Path) -> None:
    """Ranks 0 and 6 spend the least time in NCCL (SOURCES.md: 241 ms on rank 0): the
    others sit in their all-reduce kernels waiting for them."""
    skew, result = _analyse(shared_traces / "astrasim_megatron_tp8")
    assert len(skew) == 8 * 84
    named = result[result["is_straggler"]].set_index("rank")
    assert sorted(named.index) == [0, 6]
    assert (named["cost_ms_per_step"] > 100).all() and (named["cost_ms_per_step"] < 300).all()
    rest = result[~result["is_straggler"]]
    assert rest["cost_ms_per_step"].max() < named["cost_ms_per_step"].min() / 2
    # the ranks that wait longest are those with the most NCCL time (rank 4: 495 ms)
    assert result.set_index("rank")["wait_ms_per_step"].idxmax() == 4


def test_dlrm_names_rank_7(shared_traces: Path) -> None:
    """SOURCES.md: NCCL busy 1.7 ms on rank 7 .. 11.3 ms on rank 1: all wait for rank 7."""
    skew, result = _analyse(shared_traces / "param_dlrm_ddp8")
    assert result[result["is_straggler"]]["rank"].tolist() == [7]
    by_rank = result.set_index("rank")
    assert 0.75 < by_rank.loc[7, "cost_ms_per_step"] < 5
    assert by_rank["wait_ms_per_step"].idxmax() == 1


def _table(arrivals: dict[int, list[float]], seq: bool = False) -> pd.DataFrame:
    rows = []
    for rank, times in arrivals.items():
        for k, t in enumerate(times):
            rows.append(
                {
                    "pg_name": "0",
                    "seq": float(k + 1) if seq else np.nan,
                    "index": k,
                    "op": "all_reduce",
                    "rank": rank,
                    "start_ns": int(t * 1e6),
                    "step": k,
                }
            )
    return pd.DataFrame(rows)


def test_ranks_late_in_turn_name_nobody() -> None:
    table = _table({0: [0, 103, 200, 304], 1: [3, 100, 203, 300]})
    result = stragglers.stragglers(stragglers.arrival_skew(table))
    assert not result["is_straggler"].any()


def test_one_late_rank_is_named_with_its_cost() -> None:
    table = _table({0: [0, 100, 200, 300], 1: [1, 101, 201, 300], 2: [20, 121, 219, 321]}, seq=True)
    skew = stragglers.arrival_skew(table)
    assert (skew["key"] == skew["seq"]).all()
    result = stragglers.stragglers(skew).set_index("rank")
    assert result["is_straggler"].to_dict() == {0: False, 1: False, 2: True}
    assert result.loc[2, "cost_ms_per_step"] == pytest.approx(19.5)
    assert result.loc[0, "wait_ms_per_step"] == pytest.approx(20.25)


def test_one_hiccup_names_nobody() -> None:
    table = _table({0: [0, 100, 200, 300, 400], 1: [0.2, 150, 200.1, 300.2, 400.1]})
    result = stragglers.stragglers(stragglers.arrival_skew(table))
    assert not result["is_straggler"].any()


def test_single_rank_gives_empty_frames() -> None:
    skew = stragglers.arrival_skew(_table({0: [0, 1]}))
    assert skew.empty and stragglers.stragglers(skew).empty


def test_gpudiag_run_table_matches_on_seq(tmp_path: Path) -> None:
    """A run recorded by `gpudiag trace` (sample_runs/, rank 2 sleeps 40 ms per forward):
    the Flight Recorder table covers all 15 steps, matched on (group, seq)."""
    from gpudiag.rundir import load_run

    root = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp4_straggler"
    if not root.is_dir():
        pytest.skip("sample_runs/ddp4_straggler not recorded")
    run = load_run(root)
    traces = load_traces(find_traces(root), warnings=[])
    # without completion times (gloo, no --time-buckets) the collective table takes its
    # durations from the traces; the run's own rows still give every arrival
    assert not comms.collective_table(traces, run=run)["source"].str.startswith("run:").any()
    table = comms.collective_table([], run=run)
    assert table["source"].str.startswith("run:").all()
    assert table["seq"].notna().all()
    skew = stragglers.arrival_skew(table)
    assert (skew["key"] == skew["seq"]).all()
    steady = skew[skew["step"] >= 1]
    result = stragglers.stragglers(steady, run.steps)
    assert result[result["is_straggler"]]["rank"].tolist() == [2]
    cost = result.set_index("rank").loc[2, "median_cost_ms"]
    assert 30 < cost < 80  # 40 ms injected
    # the profiled window alone (steps 5-7, trace kernels) names the same rank
    from_traces = comms.collective_table(traces)
    alone = stragglers.stragglers(stragglers.arrival_skew(from_traces), run_breakdown(traces))
    assert alone[alone["is_straggler"]]["rank"].tolist() == [2]


def test_median_of_the_other_ranks_is_numpys_for_each_rank() -> None:
    """stragglers._median_of_others (one sort per step) equals, bit for bit, the median
    of the other ranks worked out rank by rank (n medians of n-1 ranks: ranks x ranks,
    which at 65,536 ranks was the straggler analysis' time), ties and NaN included."""
    from gpudiag.analysis.stragglers import _median_of_others

    rng = np.random.default_rng(7)

    def rank_by_rank(values: np.ndarray) -> np.ndarray:
        n = values.shape[0]
        return np.stack([np.median(np.delete(values, i, axis=0), axis=0) for i in range(n)])

    for trial in range(600):
        n, steps = int(rng.integers(2, 30)), int(rng.integers(1, 6))
        values = (
            rng.random((n, steps)),
            rng.integers(0, 3, (n, steps)).astype(float),  # many ties
            np.round(rng.exponential(2.0, (n, steps)), 1),
        )[trial % 3]
        if trial % 50 == 0:
            values[0, 0] = np.nan
        got, want = _median_of_others(values), rank_by_rank(values)
        np.testing.assert_array_equal(got, want)


FIXTURES = Path(__file__).parent / "fixtures"


def _median_step_ms(run: Path) -> float:
    import json

    rows = [json.loads(s) for s in (run / "rank0" / "steps.jsonl").read_text().splitlines()]
    return float(np.median([(r["end_ns"] - r["start_ns"]) / 1e6 for r in rows[2:]]))


def test_bucket_calls_issued_while_computing_are_not_counted_as_waiting() -> None:
    """Recorded gloo DDP, 4 buckets, rank 1 sleeping 40 ms per forward: rank 0 calls its
    bucket all-reduces from backward over ~15 ms, computing in between, and then waits.
    The cost is what removing the sleep gave back (the healthy run recorded beside it),
    not that plus rank 0's backward (the union of the lead intervals: 50.3 ms, +19 %)."""
    from gpudiag.analysis.pipeline import analyze

    run = FIXTURES / "straggler_buckets" / "slow_rank1"
    gain = _median_step_ms(run) - _median_step_ms(run.with_name("healthy"))
    found = [f for f in analyze(run).findings if f.kind == "straggler"]
    assert [f.ranks for f in found] == [[1]]
    assert abs(found[0].cost_ms_per_step - gain) <= 0.15 * gain, (found[0].cost_ms_per_step, gain)


def test_chain_of_overlapping_leads_counts_from_the_call_that_ends_it() -> None:
    from gpudiag.analysis.intervals import grouped_chain_tail_length

    groups = np.array([0, 0, 0, 1, 1, 2, 2])
    starts = np.array([0, 3, 60, 0, 10, 0, 50])
    ends = np.array([44, 47, 65, 50, 20, 50, 60])
    # group 0: a chain [0,44]+[3,47] -> 47-3, then [60,65] alone; group 1: [10,20] inside
    # [0,50] -> the interval ending last, 50; group 2: [0,50] and [50,60] only touch -> both
    assert grouped_chain_tail_length(groups, starts, ends).tolist() == [49, 50, 60]
