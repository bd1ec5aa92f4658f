"""The per-call tables of an analysis (every collective call of every rank) are kept in
the fold's spill file (spill.SpilledTable), made a few ranks at a time
(comms.collective_pieces) and read back by the columns each analysis reads; the fold's
store of the collective rows goes there too once the table is made (fold.TableStore.
spill). Whatever the piece size, what is read back must be the table made at once, on
recorded traces of GPU jobs and on the gloo sample runs, also where the spill file
cannot be written."""

from __future__ import annotations

import io
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze, comms, fold, ingest, pipeline, spill, stragglers
from gpudiag.paths import sample_runs_dir
from tests.test_fold import _sent_back

# pieces of one row, a few rows, an odd size, and the default (one piece here)
PIECE_ROWS = (1, 5, 37, comms.TABLE_PIECE_ROWS)


def _folded(files: list[Path]) -> tuple[list[ingest.RankTrace], fold.RankFold]:
    """The traces as the client holds them: sent back as from a worker, folded."""
    folded = fold.RankFold()
    traces = ingest.load_traces(
        files,
        warnings=[],
        prepare=pipeline.prepare_rank,
        run_tasks=_sent_back,
        on_arrival=folded.add,
    )
    return traces, folded


def _sets(shared: Path) -> list[tuple[str, list[Path]]]:
    """Every recorded set of 2+ ranks in ../shared/traces and the sample runs' traces."""
    out = []
    for d in sorted(p for p in shared.iterdir() if p.is_dir()):
        files = ingest.find_traces(d)
        if len(files) > 1:
            out.append((d.name, files))
    for run in ("ddp4_straggler", "ddp2_healthy"):
        out.append((run, ingest.find_traces(sample_runs_dir() / run)))
    return out


@pytest.fixture(scope="module")
def folded_sets(shared_traces: Path) -> list[tuple[str, list[ingest.RankTrace], fold.RankFold]]:
    return [(name, *_folded(files)) for name, files in _sets(shared_traces)]


def _equal(left: pd.DataFrame, right: pd.DataFrame, label: str) -> None:
    pd.testing.assert_frame_equal(left, right, check_exact=True, obj=label)


def test_the_table_in_pieces_of_whole_ranks_is_the_table(folded_sets: list) -> None:
    for name, traces, _ in folded_sets:
        whole = comms.collective_table(traces)
        assert len(whole), name
        for rows in PIECE_ROWS:
            pieces = list(comms.collective_pieces(traces, rows=rows))
            assert len(pieces) > 1 or len(whole) <= rows, (name, rows)
            ranks = [set(p["rank"]) for p in pieces]
            assert sum(map(len, ranks)) == len(set().union(*ranks)), name  # whole ranks
            _equal(pd.concat(pieces, ignore_index=True), whole, f"{name} in {rows}-row pieces")
            kept = spill.SpilledTable.build(iter(pieces), spill.SpillFile())
            assert kept is not None and kept.spilled, name
            _equal(kept.frame(), whole, f"{name} spilled, {rows}-row pieces")
            stall = comms.allreduce_stall_by_ranks(traces, kept.pieces(comms.STALL_READS))
            _equal(stall, comms.allreduce_stall(traces, whole), f"{name} stall by pieces")


def test_a_spilled_table_reads_back_its_columns_and_rows(folded_sets: list) -> None:
    """Any columns, any first rows, pickled (the dashboard's cache), in memory where the
    file cannot be written: the rows kept, dtypes included."""
    for name, traces, _ in folded_sets:
        whole = comms.collective_table(traces)
        skew = stragglers.arrival_skew(whole)
        for table in (whole, skew, comms.ddp_buckets(whole)):
            pieces = [
                table.iloc[i : i + 37].reset_index(drop=True) for i in range(0, len(table), 37)
            ]
            for file in (spill.SpillFile(), _failed_spill_file()):
                kept = spill.SpilledTable.build(iter(pieces or [table]), file)
                assert kept is not None and len(kept) == len(table), name
                _equal(kept.frame(), table, name)
                columns = list(table.columns[::-3])
                _equal(kept.frame(columns), table[columns], name)
                for rows in (0, 1, 40, len(table) + 3):
                    _equal(kept.frame(rows=rows), table.iloc[:rows], name)
                _equal(pickle.loads(pickle.dumps(kept)).frame(), table, name)
                _equal(pd.concat(list(kept.pieces()), ignore_index=True), table, name)


def _failed_spill_file() -> spill.SpillFile:
    """A spill file whose writes fail (a full disk): what it keeps stays in memory."""
    file = spill.SpillFile()
    file._failed = True
    return file


def test_pieces_unlike_the_first_are_joined_as_pd_concat_joins_them(folded_sets: list) -> None:
    _, traces, _ = folded_sets[0]
    table = comms.collective_table(traces)
    head, tail = table.iloc[:10].reset_index(drop=True), table.iloc[10:].reset_index(drop=True)
    widened = tail.assign(rank=tail["rank"].astype(float))  # another dtype
    narrowed = tail.drop(columns=["link"])  # other columns
    for pieces in ([head, widened], [head, narrowed, tail], [head.set_axis(range(5, 15)), tail]):
        kept = spill.SpilledTable.build(iter(pieces), spill.SpillFile())
        assert kept is not None
        _equal(kept.frame(), pd.concat(pieces, ignore_index=True), "unlike pieces")


def test_the_stores_rows_read_back_the_same_once_spilled(
    folded_sets: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the table is made, the fold's collective rows go to the spill file: every
    rank's own frame, its number columns and the table across ranks read back the same,
    and a write to a rank's rows (with_constant) brings them back into memory."""
    for name, traces, folded in folded_sets:
        before = comms.collective_table(traces)
        own = [comms.trace_rows(t) for t in traces]
        folded.spill_rows("collective_rows")
        store = folded.tables["collective_rows"]
        assert all(cols.spilled for cols in store._layouts.values()), name
        _equal(comms.collective_table(traces), before, f"{name} table, rows spilled")
        for trace, frame in zip(traces, own, strict=True):
            _equal(comms.trace_rows(trace), frame, f"{name} rank {trace.meta.rank}")
            rows = trace.cache["collective_rows"]
            start, end = rows.columns(["start_ns", "end_ns"])
            assert (start == frame["start_ns"].to_numpy()).all()
            assert (end == frame["end_ns"].to_numpy()).all()

    traces, folded = _folded(ingest.find_traces(sample_runs_dir() / "ddp4_straggler"))
    last = comms.trace_rows(traces[-1])
    folded.spill_rows("collective_rows")
    first = traces[0].cache["collective_rows"]
    assert first.with_constant("bytes", np.float64(1.0)) is first
    assert not any(cols.spilled for cols in folded.tables["collective_rows"]._layouts.values())
    assert (comms.trace_rows(traces[0])["bytes"] == 1.0).all()
    _equal(comms.trace_rows(traces[-1]), last, "another rank, back in memory")

    def full_disk(**_: object) -> io.BufferedRandom:
        return open("/dev/full", "r+b")  # noqa: SIM115 - the spill file keeps it open

    monkeypatch.setattr(tempfile, "TemporaryFile", full_disk)
    traces, folded = _folded(ingest.find_traces(sample_runs_dir() / "ddp4_straggler"))
    before = comms.collective_table(traces)
    folded.spill_rows("collective_rows")
    assert folded.spill.size == 0
    _equal(comms.collective_table(traces), before, "rows kept in memory (full disk)")


def test_a_stored_column_is_read_and_spilled_from_its_chunks(folded_sets: list) -> None:
    """The store reads a column's rows from its chunks as they are (never joined in
    memory first), and spills them chunk by chunk: the same rows as from the joined
    column, for every column of the recorded collective rows, cut into uneven chunks."""
    rng = np.random.default_rng(3)
    checked = 0

    def same(got: np.ndarray, want: np.ndarray, err_msg: str) -> None:
        assert got.dtype == want.dtype, err_msg
        pd.testing.assert_series_equal(pd.Series(got), pd.Series(want), obj=err_msg)

    for name, traces, _ in folded_sets:
        table = comms.collective_table(traces)
        for column in table.columns:
            values = table[column].to_numpy()
            if values.dtype.kind not in "biufO" or len(values) < 4:
                continue
            few = np.unique(rng.integers(1, len(values), 6))
            many = np.unique(rng.integers(1, len(values), 3 * fold._CHUNK_PARTS))
            for cuts, blocks_to in ((few, None), (many, spill.SpillFile())):
                label = f"{name} {column}, {len(cuts) + 1} parts"
                cols = fold._Columns((column,), (values.dtype,), spill_to=blocks_to)
                for chunk in np.split(values, cuts):
                    cols.append((chunk,))
                # blocks of _CHUNK_PARTS parts went to disk as they were made
                blocked = len(cuts) + 1 >= fold._CHUNK_PARTS
                assert cols.spilled == (blocks_to is not None and blocked), label
                spans = [(int(a), int(rng.integers(0, len(values) - a + 1))) for a in cuts[:3]]
                spans += [(0, len(values)), (len(values), 0)]
                want = [values[a : a + n] for a, n in spans]
                same(cols.rows_of(0, spans), np.concatenate(want), err_msg=label)
                for (a, n), rows in zip(spans, want, strict=True):
                    same(cols.rows_of(0, [(a, n)], view=True), rows, err_msg=label)
                cols.spill(spill.SpillFile())
                assert cols.spilled, label
                assert not any(isinstance(c, np.ndarray) for c in cols.chunks[0]), label
                same(cols.rows_of(0, spans), np.concatenate(want), err_msg=label)
                checked += 1
    assert checked >= 40


def test_an_analysis_keeps_its_per_call_tables_on_disk() -> None:
    """The result's collectives, skew and buckets are in the spill file, and read back
    as the tables the analyses make from the traces."""
    run = sample_runs_dir() / "ddp4_straggler"
    result = analyze(run, run_tasks=_sent_back)
    assert result.collectives.spilled and result.skew.spilled and result.buckets.spilled
    table = comms.collective_table(result.traces, run=rundir.load_run(run))
    _equal(result.collectives.frame(), table, "collectives")
    _equal(result.buckets.frame(), comms.ddp_buckets(table), "buckets")
    assert len(result.skew) and set(result.skew.columns) == set(stragglers.SKEW_COLUMNS)
