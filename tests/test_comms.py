"""Collective table, bandwidth factors, summary and buckets on real GPU traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis import comms
from gpudiag.analysis.ingest import find_traces, load_traces


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce", 2, 1.0),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 8, 0.875),
        ("broadcast", 8, 1.0),
        ("send_recv", 2, 1.0),
    ],
)
def test_nccl_tests_bus_bandwidth_factors(op: str, n: int, factor: float) -> None:
    assert comms.busbw_factor(op, n) == factor


@pytest.fixture(scope="module")
def megatron(shared_traces: Path):
    traces = load_traces(find_traces(shared_traces / "astrasim_megatron_tp8"), warnings=[])
    return traces, comms.collective_table(traces)


def test_megatron_collective_table(megatron) -> None:
    traces, table = megatron
    assert list(table.columns)[: len(comms.TABLE_COLUMNS)] == list(comms.TABLE_COLUMNS)
    assert table.groupby("rank").size().tolist() == [84] * 8
    assert (table["op"] == "all_reduce").all() and (table["pg_size"] == 8).all()
    assert (table["index"].groupby(table["rank"]).max() == 83).all()
    big = table[table["bytes"] == 4 * 2048 * 4096 * 2]
    expected = big["bytes"] / (big["dur_ms"] * 1e6) * 1.75
    assert np.allclose(big["busbw_gbs"], expected)
    assert (table["peak_gbs"] == 300.0).all()  # A100-SXM4 NVLink 3
    assert table["link"].str.contains("A100-SXM4-80GB").all()
    # the fastest 64 MiB all-reduce is a plausible A100 NVLink figure: 50-300 GB/s bus
    assert 50 < big["busbw_gbs"].max() < 300


def test_summary_counts_per_rank(megatron) -> None:
    _, table = megatron
    summary = comms.collective_summary(table)
    assert summary["op"].tolist() == ["all_reduce"]
    row = summary.iloc[0]
    assert row["count"] == 84 and row["ranks"] == 8 and row["peak_gbs"] == 300.0
    assert row["total_ms"] == pytest.approx(table["dur_ms"].sum() / 8)


def test_dlrm_ops_buckets_and_stall(shared_traces: Path) -> None:
    traces = load_traces(find_traces(shared_traces / "param_dlrm_ddp8"), warnings=[])
    table = comms.collective_table(traces)
    summary = comms.collective_summary(table).set_index("op")
    assert summary.loc["all_to_all", "count"] == 5 and summary.loc["all_reduce", "count"] == 3
    assert (
        table.loc[table["op"] == "all_to_all", "busbw_gbs"]
        == table.loc[table["op"] == "all_to_all", "algbw_gbs"] * 0.875
    ).all()
    buckets = comms.ddp_buckets(table)
    assert buckets.groupby("rank").size().tolist() == [3] * 8
    assert (buckets.groupby("rank")["bytes"].sum() == 1576964 + 907840 + 448).all()
    stall = comms.allreduce_stall(traces, table)
    assert len(stall) == 8 and (stall["stall_ms"] >= 0).all()
    assert (stall["stall_ms"] <= stall["stall_ms"].max()).all() and stall["stall_ms"].max() < 15


def test_rccl_generic_and_unknown_ops(shared_traces: Path) -> None:
    traces = load_traces(find_traces(shared_traces / "tracelens_mi300_ddp"), warnings=[])
    summary = comms.collective_summary(comms.collective_table(traces)).set_index("op")
    assert summary.loc["all_reduce", "count"] == 6 and summary.loc["broadcast", "count"] == 6
    # kernels whose launch lies before the profiled window keep no type: shown, not dropped
    assert summary.loc["unknown", "count"] == 5
    assert summary.loc["all_reduce", "peak_gbs"] == 448.0


def test_empty_inputs() -> None:
    table = comms.collective_table([])
    assert table.empty and list(table.columns) == list(comms.TABLE_COLUMNS)
    assert comms.collective_summary(table).empty
    assert comms.ddp_buckets(table).empty
    assert comms.allreduce_stall([], table).empty


def test_bus_bandwidth_factors_of_a_table_equal_each_calls() -> None:
    """comms.busbw_factors (one array operation over the collective table) equals
    busbw_factor call by call: every op family, group sizes 0, 1, fractional, missing."""
    ops = pd.Series(
        ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", None, "x"] * 4,
        dtype="str",
    )
    sizes = pd.Series(
        [8, 2, 4, 16, 8, 8, 8, 1, 1, 1, 0, np.nan, 0.5, 3, np.nan, 0, 7, 1e6, 2, 5, 9, 3]
        + [2, 4, 6, 8, 10, -1],
        dtype=float,
    )
    want = np.array([comms.busbw_factor(op, n) for op, n in zip(ops, sizes, strict=True)])
    np.testing.assert_array_equal(comms.busbw_factors(ops, sizes), want)


# DDP's own knobs: advice that names one fits only a run that shows DDP (issue 31, D)
DDP_KNOBS = ("bucket_cap_mb", "no_sync", "DDP(", "gradient_as_bucket_view", "comm hook")


@pytest.mark.parametrize(
    ("trace_set", "evidence"),
    [
        ("astrasim_megatron_tp8", None),  # tensor-parallel all-reduces, no DDP in the traces
        ("tracelens_b200_vllm", None),  # vLLM's tensor-parallel all-reduces
        ("tracelens_mi300_ddp", "DistributedDataParallel.forward in the traces"),
        ("hta_nccl_a100", "DistributedDataParallel.forward in the traces"),
    ],
)
def test_all_reduces_are_ddp_buckets_only_where_the_run_shows_ddp(
    shared_traces: Path, trace_set: str, evidence: str | None
) -> None:
    """On Megatron TP8 the tensor-parallel all-reduces were called DDP "buckets" and got
    DDP-only fixes (bucket_cap_mb, no_sync). Now they are "all-reduce calls" with advice
    that fits, unless DDP's names are in the traces."""
    from gpudiag.analysis import analyze

    result = analyze(shared_traces / trace_set)
    assert result.run.ddp_evidence == evidence
    assert result.run.to_json()["ddp_evidence"] == evidence
    exposed = next(f for f in result.findings if f.kind == "exposed_communication")
    advice = " ".join(
        [f.fix for f in result.findings] + [a for p in result.whatif for a in p.assumptions]
    )
    if evidence is None:
        assert result.run.allreduce_label == "all-reduce calls"
        assert not [k for k in DDP_KNOBS if k in advice], advice
        # "bucket" only where the fix says they are not DDP's gradient buckets
        assert "bucket" not in advice.replace("not DDP's gradient buckets", "").lower(), advice
        assert "bucket_size" not in {f.kind for f in result.findings}
        assert "comm_bucketed" not in {p.scenario for p in result.whatif}
        assert "not DDP's gradient buckets" in exposed.fix
    else:
        assert result.run.allreduce_label == "DDP gradient buckets"
        assert "bucket_cap_mb" in exposed.fix and "no_sync" in exposed.fix


def test_a_gpudiag_run_shows_ddp_by_its_logging_data() -> None:
    """A gloo DDP run recorded by gpudiag trace (the shipped sample): DDP's logging data
    (its bucket sizes) is the evidence; the DDP advice stays."""
    from gpudiag.analysis import analyze

    result = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "ddp4_straggler")
    assert result.run.ddp_evidence == "DDP's logging data (bucket sizes) recorded by gpudiag trace"
    assert result.run.allreduce_label == "DDP gradient buckets"
    kinds = {f.kind: f for f in result.findings}
    assert "bucket_cap_mb" in kinds["exposed_communication"].fix
    assert kinds["bucket_size"].title.startswith("DDP uses few gradient buckets")
