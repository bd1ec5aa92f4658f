"""Folding per-rank results as they arrive (gpudiag/analysis/fold.py) changes no number:
the cross-rank inputs it gives (every rank's step breakdown and collectives) equal the
per-rank frames concatenated, and a whole analysis through the folding path, as the
Dask path runs it (each rank's task result pickled and sent back without its events),
gives the same JSON as the local pool's.

Real recorded traces from ../shared/traces and the sample runs, read in place.
"""

from __future__ import annotations

import gc
import io
import json
import pickle
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze, comms, fold, ingest, jsonable, pipeline, spill
from gpudiag.analysis import breakdown as bd
from gpudiag.analysis import timeline as tl
from gpudiag.paths import sample_runs_dir
from gpudiag.report import jsonout
from gpudiag.report.jsonout import dumps
from tests.copied_ranks import copied_ranks, link_ranks

FAST_SETS = ("param_dlrm_ddp8", "astrasim_megatron_tp8", "hta_sampled_2of128")


def _sent_back(
    task: Callable[[ingest.LoadJob], ingest.LoadResult], jobs: list[ingest.LoadJob]
) -> Iterator[tuple[int, ingest.LoadResult]]:
    """The Dask path's per-rank tasks, run here: each result pickled as a worker sends
    it back, handed on as it arrives (ingest.RunTasks)."""
    for i, job in enumerate(jobs):
        trace, notes = pickle.loads(pickle.dumps(task(job)))
        if trace is not None:
            ingest.share_empty_events(trace)
        yield i, (trace, notes)


def _load(files: list[Path], folded: fold.RankFold | None) -> list[ingest.RankTrace]:
    return ingest.load_traces(
        files,
        warnings=[],
        prepare=pipeline.prepare_rank,
        run_tasks=_sent_back,
        on_arrival=folded.add if folded is not None else None,
    )


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("name", FAST_SETS)
def test_folded_tables_equal_the_per_rank_frames(shared_traces: Path, name: str) -> None:
    files = rundir.find_traces(shared_traces / name)
    plain = _load(files, None)
    folded = fold.RankFold()
    traces = _load(files, folded)
    assert [t.meta.rank for t in traces] == [t.meta.rank for t in plain]
    # every table moved into the stores; nothing per rank but a handle
    for key in fold.FOLDED_TABLES:
        assert all(isinstance(t.cache[key], fold.StoredRows) for t in traces), key
    pairs = (("step_breakdown", bd.step_breakdown), ("collective_rows", comms.trace_rows))
    for key, per_rank in pairs:
        want = _concat([f for t in plain if len(f := per_rank(t))])
        got = _concat(fold.rank_rows(traces, key, per_rank))
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        # one rank alone reads back as before too (RankTrace.cached)
        pd.testing.assert_frame_equal(per_rank(traces[-1]), per_rank(plain[-1]), check_exact=True)
    pd.testing.assert_frame_equal(
        comms.collective_table(traces), comms.collective_table(plain), check_exact=True
    )
    for a, b in zip(traces, plain, strict=True):  # read rank by rank
        pd.testing.assert_frame_equal(bd.step_windows(a), bd.step_windows(b), check_exact=True)
    # the rest of each cache is kept pickled in the spill file and reads back as it was
    assert all(isinstance(t.cache, fold.SpilledCache) and t.cache.spilled for t in traces)
    for a, b in zip(traces, plain, strict=True):
        assert list(a.cache) == list(b.cache)
        for key in ("dataloader", "host_sync", "kernel_busy", "comm_comp_overlap", "uses_ddp"):
            assert repr(a.cache.get(key)) == repr(b.cache.get(key)), key
        names = bd.activity_sets(b).keys()
        got, want = bd.activity_sets(a).several(names), bd.activity_sets(b).several(names)
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.concatenate(x), np.concatenate(y))
        pd.testing.assert_frame_equal(tl.rank_timeline(a), tl.rank_timeline(b), check_exact=True)
    assert all(t.cache.spilled for t in traces)  # reading kept nothing in memory
    # the step tables: folded (a handle per rank), read back per rank and across ranks
    assert all(isinstance(t.step_rows, fold.StoredRows) for t in traces if len(t.steps))
    for a, b in zip(traces, plain, strict=True):
        pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    with_rank = [t.steps.assign(rank=t.meta.rank) for t in plain if len(t.steps)]
    if with_rank:
        got = _concat(fold.rank_rows(traces, fold.STEPS, lambda t: t.steps))
        pd.testing.assert_frame_equal(got, _concat(with_rank), check_exact=True)


def test_folded_step_tables_are_changed_like_frames(shared_traces: Path) -> None:
    """What the client changes in a step table after folding (the final rank, a node's
    clock offset) reads back as on a plain frame, and touches no other rank's rows."""
    files = rundir.find_traces(shared_traces / "param_dlrm_ddp8")
    plain = _load(files, None)
    traces = _load(files, fold.RankFold())
    first, second = traces[0], traces[1]
    before = second.steps
    first.meta.rank = 17
    first.set_step_rank()
    assert isinstance(first.step_rows, fold.StoredRows)  # changed in its store
    want = plain[0].steps.assign(rank=np.int64(17))
    pd.testing.assert_frame_equal(first.steps, want, check_exact=True)
    pd.testing.assert_frame_equal(second.steps, before, check_exact=True)
    got = fold.rank_rows(traces, fold.STEPS, lambda t: t.steps)[0]
    assert (got["rank"].iloc[: len(want)] == 17).all()
    # the clock offset of a node, applied on the client: a folded table is put back
    second.cache.pop("clock_offset_ns", None)
    pipeline.shift_trace(second, 1_000)
    shifted = before.assign(start_ns=before["start_ns"] + 1_000, end_ns=before["end_ns"] + 1_000)
    pd.testing.assert_frame_equal(second.steps, shifted, check_exact=True)


def _blobs(traces: list[ingest.RankTrace]) -> list[spill.Blob]:
    return [getattr(t.cache.get(key), "blob", b"") for t in traces for key in fold._SPILLED]


def test_packed_blobs_are_spilled_and_read_back_exactly(
    shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank's packed timeline and activity sets go to the fold's spill file: the
    timeline, the activity sets and a pickled result read the same bytes back. Where
    no temporary file can be written (no directory, a full disk) they stay in memory."""
    files = rundir.find_traces(shared_traces / "astrasim_megatron_tp8")
    plain = _load(files, None)
    folded = fold.RankFold()
    traces = _load(files, folded)
    kept, spilled = _blobs(plain), _blobs(traces)
    assert all(isinstance(b, bytes) for b in kept)
    assert all(isinstance(b, spill.SpilledBytes) for b in spilled)
    assert [spill.as_bytes(b) for b in spilled] == kept
    assert folded.spill.size > sum(len(b) for b in kept) > 100_000  # and the caches
    pd.testing.assert_frame_equal(tl.timeline(traces), tl.timeline(plain), check_exact=True)
    for a, b in zip(traces, plain, strict=True):
        sets = a.cache["activity_sets"]
        for name in sets.names:
            for got, want in zip(sets[name], b.cache["activity_sets"][name], strict=True):
                np.testing.assert_array_equal(got, want)
    again = pickle.loads(pickle.dumps(traces[0].cache["timeline"]))  # saved or sent on
    assert isinstance(again.blob, bytes)
    pd.testing.assert_frame_equal(again.frame(), plain[0].cache["timeline"].frame())
    whole = pickle.loads(pickle.dumps(traces[0]))  # a result cached by the dashboard
    assert type(whole.cache) is dict and list(whole.cache) == list(plain[0].cache)
    assert isinstance(whole.cache["timeline"].blob, bytes)
    pd.testing.assert_frame_equal(tl.rank_timeline(whole), tl.rank_timeline(plain[0]))
    # a result worked out on the client is kept: the cache is back in memory, whole
    traces[1].cache["computed here"] = 1.5
    assert not traces[1].cache.spilled and traces[1].cache["computed here"] == 1.5
    assert list(traces[1].cache) == [*plain[1].cache, "computed here"]

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such directory"))
    in_memory = fold.RankFold()
    kept_in_memory = _load(files, in_memory)
    assert _blobs(kept_in_memory) == kept
    assert in_memory.spill.size == 0
    # the caches stay pickled, in memory, and read back the same
    assert all(t.cache.spilled for t in kept_in_memory)  # type: ignore[attr-defined]
    pd.testing.assert_frame_equal(tl.timeline(kept_in_memory), tl.timeline(plain), check_exact=True)

    def full_disk(**_: object) -> io.BufferedRandom:
        return open("/dev/full", "r+b")  # noqa: SIM115 - the spill file keeps it open

    monkeypatch.setattr(tempfile, "TemporaryFile", full_disk)
    full = fold.RankFold()
    assert _blobs(_load(files, full)) == kept
    assert full.spill.size == 0


def test_no_rank_cache_comes_back_into_memory_during_an_analysis() -> None:
    """A whole analysis, its JSON and its Timeline read every rank's cache and write
    none: each stays pickled in the spill file, with the local pool (which keeps the
    events, so a result missing from the cache would be worked out and written: the time
    range was) and as the Dask path sends results back."""
    run = sample_runs_dir() / "ddp4_straggler"
    for kw in ({"workers": 1}, {"run_tasks": _sent_back}):
        result = analyze(run, **kw)  # type: ignore[arg-type]
        result.to_json()
        result.timeline()
        caches = [t.cache for t in result.traces]
        assert len(caches) == 4
        assert all(isinstance(c, fold.SpilledCache) and c.spilled for c in caches), kw


def _json(path: Path, **kw: object) -> str:
    return dumps(analyze(path, **kw).to_json())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "where", ["param_dlrm_ddp8", "astrasim_megatron_tp8", "sample:ddp4_straggler"]
)
def test_analysis_through_the_folding_path_equals_the_local_one(
    shared_traces: Path, where: str
) -> None:
    path = (
        sample_runs_dir() / where.split(":", 1)[1]
        if where.startswith("sample:")
        else shared_traces / where
    )
    local = _json(path, workers=1)
    remote = analyze(path, run_tasks=_sent_back)
    assert all(t.events_dropped for t in remote.traces)
    assert dumps(remote.to_json()) == local


def test_store_with_several_layouts_equals_pandas_concat() -> None:
    parts = [
        pd.DataFrame({"a": np.arange(3, dtype=np.int64), "s": ["x", "y", None]}),
        pd.DataFrame({"a": np.arange(2, dtype=np.int32), "s": ["y", "z"]}),
        pd.DataFrame({"a": [1.5], "s": pd.Categorical(["x"])}),
        pd.DataFrame({"a": np.arange(4, dtype=np.int64), "s": ["q", "x", "x", "y"]}),
    ]
    store = fold.TableStore()
    stored = [store.add(ingest.FrameColumns.of(p)) for p in parts]
    assert all(s is not None for s in stored)
    ids = [s.part for s in stored if s is not None]
    pd.testing.assert_frame_equal(
        store.frame(ids), pd.concat(parts, ignore_index=True), check_exact=True
    )
    same = [ids[0], ids[3], ids[0]]  # one layout, any order, repeated
    pd.testing.assert_frame_equal(
        store.frame(same),
        pd.concat([parts[0], parts[3], parts[0]], ignore_index=True),
        check_exact=True,
    )
    for part, s in zip(parts, stored, strict=True):
        assert s is not None
        pd.testing.assert_frame_equal(s.frame(), part, check_exact=True)
        # pickled alone (a result saved or sent on), it is plain columns again
        again = pickle.loads(pickle.dumps(s))
        assert isinstance(again, ingest.FrameColumns)
        pd.testing.assert_frame_equal(again.frame(), part, check_exact=True)


def test_json_written_as_encoded_equals_dumps(
    shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpudiag analyze --json` writes the text piece by piece, one top-level section
    built at a time (jsonout.write_results): the same text as dumps of to_json(), for
    one result and for several (a list), whatever the batch size."""
    result = analyze(shared_traces / "param_dlrm_ddp8", workers=1)
    other = analyze(sample_runs_dir() / "ddp4_straggler", workers=1)
    payload = result.to_json()
    want = dumps(payload) + "\n"
    want_both = dumps([payload, other.to_json()]) + "\n"
    for batch in (1, 7, 16384):
        monkeypatch.setattr(jsonout, "_BATCH", batch)
        for write, want_text in (
            (lambda out: jsonout.write(payload, out), want),
            (lambda out: jsonout.write_results([result], out), want),
            (lambda out: jsonout.write_results([result, other], out), want_both),
        ):
            out = io.StringIO()
            write(out)
            assert out.getvalue() == want_text


def _held_per_rank(sources: list[Path], run: Path) -> float:
    """Bytes the client holds per rank once every rank of ``run`` is loaded and folded:
    its file list, the traces and the fold (tracemalloc; as pipeline.analyze keeps them)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        files = rundir.find_traces(run)
        folded = fold.RankFold()
        traces = ingest.load_traces(
            files,
            warnings=[],
            prepare=pipeline.prepare_rank,
            run_tasks=copied_ranks(sources),
            on_arrival=folded.add,
        )
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(traces) == len(files) and len(folded.tables["collective_rows"]._part_rows)
    return held / len(files)


def test_a_rank_is_held_in_a_few_kilobytes(tmp_path: Path) -> None:
    """The client's memory grows with the ranks by what it keeps of each (docs/cluster.md
    "Per rank"): 256 ranks linked to the sample run's 4 recorded gloo traces, each rank's
    result a copy as a worker sends it back."""
    sources = sorted((sample_runs_dir() / "ddp4_straggler" / "traces").glob("rank*.json.gz"))
    _held_per_rank(sources, link_ranks(sources, 8, tmp_path / "warm"))  # caches, imports
    per_rank = _held_per_rank(sources, link_ranks(sources, 256, tmp_path / "traces"))
    print(f"held per rank: {per_rank:.0f} bytes")
    assert per_rank < 3500  # measured 2.6 kB (4.8 kB before the caches were spilled)


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def _peak_while(write: Callable[[], None]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        write()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_per_rank_lists_are_written_a_slice_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--json` of a many-rank run never holds a per-rank list whole (the ``ranks``,
    ``stragglers``, ``dataloader`` and ``gpu`` lists are jsonable.Rows, made as they are
    written): writing it holds a fraction of what the JSON's dict costs, and its text
    is the same, whatever the slice sizes."""
    sources = sorted((sample_runs_dir() / "ddp4_straggler" / "traces").glob("rank*.json.gz"))
    run = link_ranks(sources, 1024, tmp_path / "traces")
    result = pipeline.analyze(run, run_tasks=copied_ranks(sources))
    assert len(result.ranks) == 1024
    monkeypatch.setattr(jsonout, "_BATCH", 256)  # pieces written at a time
    monkeypatch.setattr(jsonable, "_ROWS_AT_A_TIME", 32)
    streamed = _peak_while(lambda: jsonout.write_results([result], _Discard()))
    whole = _peak_while(lambda: result.to_json() and None)
    print(f"writing peaks at {streamed} bytes, the JSON's dict at {whole}")
    assert streamed < whole / 3  # measured 0.7 vs 2.9 MB

    monkeypatch.setattr(jsonout, "_BATCH", 7)
    monkeypatch.setattr(jsonable, "_ROWS_AT_A_TIME", 3)
    out = io.StringIO()
    jsonout.write_results([result], out)
    assert out.getvalue() == dumps(result.to_json()) + "\n"
    assert json.loads(out.getvalue())["ranks"][1023]["rank"] == 1023
