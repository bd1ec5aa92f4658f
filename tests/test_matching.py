"""The cross-rank analyses of collective calls take the calls a few whole matched groups
at a time (gpudiag/analysis/matching.py): their results must be those of the whole
table at once, on recorded traces of GPU jobs and on the gloo sample runs, whatever the
piece size and the table's row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis import comms, matching, stragglers
from gpudiag.analysis.ingest import find_traces, load_traces
from gpudiag.rundir import load_run

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
# pieces smaller than one matched group, a few groups, and an odd size
PIECE_ROWS = (1, 5, 37)


def _tables(shared: Path) -> list[tuple[str, pd.DataFrame]]:
    """Collective tables of every recorded set of 2+ ranks, and of each sample run (its
    traces, and its run's own collectives table)."""
    out = []
    for d in sorted(p for p in shared.iterdir() if p.is_dir()):
        files = find_traces(d)
        if len(files) > 1:
            out.append((d.name, comms.collective_table(load_traces(files, warnings=[]))))
    for run_dir in ("ddp4_straggler", "ddp2_healthy"):
        root = SAMPLE_RUNS / run_dir
        traces = load_traces(find_traces(root), warnings=[])
        out.append((run_dir, comms.collective_table(traces)))
        out.append((f"{run_dir} run table", comms.collective_table([], run=load_run(root))))
    return [(name, table) for name, table in out if len(table)]


@pytest.fixture(scope="module")
def tables(shared_traces: Path) -> list[tuple[str, pd.DataFrame]]:
    return _tables(shared_traces)


def _shuffled(table: pd.DataFrame) -> pd.DataFrame:
    """The rows in another order, with a repeated row and an index that is not 0..n-1."""
    rng = np.random.default_rng(0)
    mixed = table.iloc[rng.permutation(len(table))]
    mixed = pd.concat([mixed, mixed.iloc[:3]])
    return mixed.set_axis(np.arange(len(mixed)) * 3 + 7)


def test_pieces_hold_each_row_once_and_groups_whole(tables: list) -> None:
    for name, table in tables:
        key = matching.match_key(table)
        for rows in PIECE_ROWS:
            pieces = list(matching.match_group_chunks(table, ["pg_name", "rank"], rows=rows))
            at = np.concatenate([p.index.to_numpy() for p in pieces])
            assert sorted(at) == list(range(len(table))), name
            groups = [set(zip(p["pg_name"], p["key"], strict=True)) for p in pieces]
            assert sum(len(g) for g in groups) == len(set().union(*groups)), name  # whole
            assert len(pieces) > 1 or len(table) <= rows, name
            for p in pieces:
                assert (np.diff(p.index.to_numpy()) > 0).all(), name  # the table's order
                assert (p["key"].to_numpy() == key.to_numpy()[p.index.to_numpy()]).all()


@pytest.mark.parametrize("rows", PIECE_ROWS)
def test_skew_and_waits_in_pieces_equal_the_whole_table(
    tables: list, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = {}
    for name, table in tables:
        for label, t in ((name, table), (f"{name} shuffled", _shuffled(table))):
            whole[label] = (stragglers.arrival_skew(t), comms._wait_spans(t, None))
    monkeypatch.setattr(matching, "MATCH_CHUNK_ROWS", rows)
    compared = 0
    for name, table in tables:
        for label, t in ((name, table), (f"{name} shuffled", _shuffled(table))):
            skew, waits = whole[label]
            assert len(skew), label
            pd.testing.assert_frame_equal(stragglers.arrival_skew(t), skew, obj=label)
            pd.testing.assert_frame_equal(comms._wait_spans(t, None), waits, obj=label)
            compared += 1
    assert compared >= 10


def test_stragglers_named_in_pieces_as_at_once(
    tables: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = dict(tables)["astrasim_megatron_tp8"]
    at_once = stragglers.stragglers(stragglers.arrival_skew(table))
    monkeypatch.setattr(matching, "MATCH_CHUNK_ROWS", 5)
    in_pieces = stragglers.stragglers(stragglers.arrival_skew(table))
    pd.testing.assert_frame_equal(in_pieces, at_once)
    assert sorted(in_pieces[in_pieces["is_straggler"]]["rank"]) == [0, 6]


def test_concat_pieces_is_pandas_concat() -> None:
    pieces = [
        pd.DataFrame({"a": [1, 2], "s": ["x", "y"], "f": [0.5, np.nan]}, index=[4, 9]),
        pd.DataFrame({"a": [], "s": [], "f": []}),
        pd.DataFrame({"a": [3], "s": ["z"], "f": [1.5]}, index=[0]),
    ]
    expected = pd.concat([p for p in pieces if len(p)], ignore_index=True)
    pd.testing.assert_frame_equal(matching.concat_pieces(iter(pieces)), expected)
    assert matching.concat_pieces(iter(pieces[1:2])) is None
