"""Bounded analysis memory (issue 16 item 10), CI-sized: the compact event table and the
streamed parse, measured on real recorded traces in ../shared/traces (no timing).

The full-size figures (1M and 10M events, peak RSS vs the uncompressed size) come from
bench/memory.py; these tests pin the per-event costs that make them scale."""

from __future__ import annotations

import gc
import gzip
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from gpudiag.analysis import ingest, trace_files

MEGATRON = ("astrasim_megatron_tp8", "megatron_kineto_0.json.gz")  # record_param_comms args
NCCL = ("hta_nccl_a100", "nccl_data.json.gz")  # NCCL kernels with comm args

# Measured (this commit): 49.3-53.9 bytes per event on the six sets' first traces (was
# 97.6-102.3 with the comm fields as full-length columns, 48 bytes per event; 113.6-118.3
# with stream, correlation, external_id and step as int64). Every column is a fixed-width
# array or codes, so the figure is exact: one more 8-byte column per event breaks the bound.
TABLE_BYTES_PER_EVENT = 57
# The comm fields, per comm row (65.8-70.4 measured: 6 columns and the index).
COMM_BYTES_PER_ROW = 80
# Measured: 59.4 bytes per event retained after the parse of MEGATRON (columns + interned
# strings; 71.4 with int64 ids; 101.6 when the comm events' args dicts were kept per row).
PARSED_BYTES_PER_EVENT = 70


def _trace(shared_traces: Path, which: tuple[str, str]) -> Path:
    return shared_traces / which[0] / which[1]


@pytest.mark.parametrize("which", [MEGATRON, NCCL])
def test_event_table_bytes_per_event(shared_traces: Path, which: tuple[str, str]) -> None:
    trace, warnings = ingest.load_trace(_trace(shared_traces, which))
    assert trace is not None, warnings
    ev = trace.events
    # shallow: object columns hold shared strings / None, never one object per row
    per_event = ev.memory_usage(index=True, deep=False).sum() / len(ev)
    assert per_event <= TABLE_BYTES_PER_EVENT, per_event
    for column in ev.columns:
        values = ev[column].to_numpy()
        if values.dtype == object:
            assert len({id(v) for v in values}) <= 1000, column  # interned, not per row
    # the comm fields: only for the comm events, and no bigger per row than in a column
    comm = trace.comm
    kinds = ev["kind"].astype(str)
    assert list(comm.index) == list(np.flatnonzero(kinds.isin(["comm", "comm_cpu"])))
    assert len(comm) > 30 and list(comm.columns) == list(ingest.COMM_COLUMNS)
    assert comm.memory_usage(index=True, deep=False).sum() / len(comm) <= COMM_BYTES_PER_ROW


@pytest.mark.parametrize("which", [MEGATRON, NCCL])
def test_with_comm_gives_each_event_its_comm_fields(shared_traces: Path, which) -> None:
    """with_comm on any selection: a comm event's fields from ``RankTrace.comm``; every
    other event None (text) or NaN (numbers), as the full-length columns had."""
    trace, _ = ingest.load_trace(_trace(shared_traces, which))
    assert trace is not None
    ev, comm = trace.events, trace.comm
    joined = ingest.with_comm(ev, comm)
    assert list(joined.columns) == [*ev.columns, *ingest.COMM_COLUMNS]
    pd.testing.assert_frame_equal(joined.loc[comm.index, list(ingest.COMM_COLUMNS)], comm)
    others = joined.drop(index=comm.index)
    assert len(others) > 1000
    for name in ingest.COMM_COLUMNS:
        values = others[name].to_numpy()
        if comm[name].dtype == object:
            assert all(v is None for v in values), name
        else:
            assert pd.isna(values).all(), name
    # a shuffled subset keeps each row's own values
    pick = ev.sample(n=500, random_state=1).index.union(comm.index[::3])
    part = ingest.with_comm(ev.loc[pick[::-1]], comm)
    pd.testing.assert_frame_equal(part.loc[pick], joined.loc[pick])


def test_ids_beyond_int32_keep_their_values(shared_traces: Path, tmp_path: Path) -> None:
    """The narrow id columns are checked: a correlation id past int32 (here written into a
    copy of a recorded trace) makes that column int64, every value kept."""
    plain = tmp_path / "nccl_data.json"
    data = gzip.decompress(_trace(shared_traces, NCCL).read_bytes())
    plain.write_bytes(data)
    narrow, _ = ingest.load_trace(plain)
    assert narrow is not None
    for column in ("stream", "correlation", "external_id", "step"):
        assert narrow.events[column].dtype == "int32", column
    doc = orjson.loads(data)
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["args"]["correlation"] = 2**40
    wide_path = tmp_path / "wide.json"
    wide_path.write_bytes(orjson.dumps(doc))
    wide, _ = ingest.load_trace(wide_path)
    assert wide is not None
    assert wide.events["correlation"].dtype == "int64"
    assert (wide.events["correlation"] == 2**40).sum() == 1
    assert wide.events["external_id"].dtype == "int32"
    pd.testing.assert_series_equal(
        wide.events["start_ns"], narrow.events["start_ns"], check_names=False
    )


def test_parse_keeps_no_python_object_per_event(shared_traces: Path) -> None:
    path = _trace(shared_traces, MEGATRON)
    gc.collect()
    tracemalloc.start()
    try:
        doc, collected = ingest.read_trace(path, ingest.max_trace_bytes())
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert collected.n > 9000
    assert retained / collected.n <= PARSED_BYTES_PER_EVENT, retained / collected.n
    del doc, collected


def test_small_chunks_give_the_same_table(
    shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming in many chunks (comm fields split across them) builds exactly the
    table one chunk does."""
    plain = tmp_path / "nccl_data.json"
    plain.write_bytes(gzip.decompress(_trace(shared_traces, NCCL).read_bytes()))
    whole, _ = ingest.load_trace(plain)
    monkeypatch.setattr(trace_files, "CHUNK_BYTES", 64 << 10)  # ~100 chunks
    chunked, _ = ingest.load_trace(plain)
    assert whole is not None and chunked is not None
    assert whole.comm["comm_op"].notna().sum() > 50
    pd.testing.assert_frame_equal(whole.events, chunked.events)
    pd.testing.assert_frame_equal(whole.comm, chunked.comm)
    pd.testing.assert_frame_equal(whole.steps, chunked.steps)


def test_workers_fit_the_available_memory(shared_traces: Path) -> None:
    files = sorted((shared_traces / "astrasim_megatron_tp8").glob("*.json.gz"))
    sizes = [len(gzip.decompress(p.read_bytes())) for p in files]
    assert ingest.plan_workers(sizes, available=64 << 30) == len(files)
    assert ingest.plan_workers(sizes, available=0) == 1
    for available in (1 << 30, 2 << 30, 4 << 30):
        n = ingest.plan_workers(sizes, available)
        kept = ingest._KEPT_BYTES_PER_TRACE_BYTE * sum(sizes)
        loading = sum(
            ingest._WORKER_BASE_BYTES + ingest._WORKER_BYTES_PER_TRACE_BYTE * s
            for s in sorted(sizes, reverse=True)[:n]
        )
        assert n == 1 or kept + loading <= 0.8 * available
    # ten 1 GB traces on a 16 GB machine: fewer workers than cores would start
    assert ingest.plan_workers([10**9] * 10, available=16 << 30) < 10


def test_small_inputs_load_without_worker_processes(shared_traces: Path) -> None:
    """A worker costs its imports (~110 MiB): a set of traces smaller than that per
    worker loads in the parent alone; big inputs still get one worker per 64 MiB."""
    files = sorted((shared_traces / "astrasim_megatron_tp8").glob("*.json.gz"))
    hints = [ingest._uncompressed_size_hint(p) for p in files]
    actual = [len(gzip.decompress(p.read_bytes())) for p in files]
    assert sum(hints) >= sum(actual)  # the planning guess never under-counts here
    assert ingest.workers_for_input(hints) == 1
    assert ingest.workers_for_input([]) == 1
    assert ingest.workers_for_input([200 << 20] * 4) == 12
