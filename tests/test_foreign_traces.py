"""Foreign GPU traces (recorded by others, ../shared/traces and tests/fixtures): the
analysis takes what the trace records over guesses, reads every Kineto vintage, and
says what it cannot see."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.breakdown import step_breakdown
from gpudiag.analysis.comms import collective_table
from gpudiag.analysis.ingest import find_traces, load_traces

FIXTURES = Path(__file__).parent / "fixtures"
KINETO_2021 = FIXTURES / "kineto_2021_v100"
# element sizes of the C++ type names the profiler writes in "Input type"
_SIZES = {"float": 4, "int": 4, "long int": 8, "c10::Half": 2}


def _raw_events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_all_to_all_bytes_from_the_cpu_op_not_the_int8_kernel(shared_traces: Path) -> None:
    """DLRM's all_to_all runs as ncclKernel_SendRecv_..._int8_t kernels; the bytes are the
    enclosing nccl:all_to_all op's elements x its dtype (float: 4, long int: 8), not x 1."""
    paths = find_traces(shared_traces / "param_dlrm_ddp8")
    table = collective_table(load_traces(paths, warnings=[]))
    for path in paths:
        expected = []
        for e in _raw_events(path):
            if e.get("name") == "nccl:all_to_all":
                args = e["args"]
                expected.append(math.prod(args["Input Dims"][0]) * _SIZES[args["Input type"][0]])
        rank = int(path.name.split("_")[0].removeprefix("worker"))
        rows = table[(table["rank"] == rank) & (table["op"] == "all_to_all")]
        assert len(rows) == len(expected) == 5
        assert sorted(rows["bytes"]) == sorted(expected)
        assert 24576 in expected  # 6144 floats: 4x what the kernel name's int8_t gave


def test_old_kineto_categories(tmp_path: Path) -> None:
    """A 2021 Kineto writes Kernel/Memcpy/Memset/Runtime/Operator: GPU copies are compute
    (not `other`), exactly as the same events under today's category names."""
    (trace,) = load_traces(find_traces(KINETO_2021), warnings=[])
    ev = trace.events
    copies = ev[ev["kind"].isin(["memcpy", "memset"])]
    assert len(copies) > 50 and copies["is_gpu"].all()
    assert set(ev["cat"].astype(str)) >= {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op"}
    renamed = {
        "Kernel": "kernel",
        "Memcpy": "gpu_memcpy",
        "Memset": "gpu_memset",
        "Runtime": "cuda_runtime",
        "Operator": "cpu_op",
    }
    doc = json.loads(gzip.decompress(next(KINETO_2021.iterdir()).read_bytes()))
    for e in doc["traceEvents"]:
        e["cat"] = renamed.get(e.get("cat"), e.get("cat"))
    new = tmp_path / "today.json"
    new.write_text(json.dumps(doc))
    (today,) = load_traces([new], warnings=[])
    old_b, new_b = step_breakdown(trace), step_breakdown(today)
    assert np.allclose(old_b.drop(columns="rank"), new_b.drop(columns="rank"))
    # the copies' own time, inside the steps, now counts as compute
    ws = trace.steps
    inside = copies[
        (copies["start_ns"] >= ws["start_ns"].min()) & (copies["end_ns"] <= ws["end_ns"].max())
    ]
    assert inside["dur_ns"].sum() / 1e6 / len(ws) > 1.0  # ms per step


# --------------------------------------------------------------------------- findings

NO_STEPS = "tracelens_b200_vllm"  # 8-GPU vLLM inference, rank 0: no ProfilerStep marks


def test_gpu_idle_without_profiler_steps(shared_traces: Path) -> None:
    """The whole trace is one step: a GPU idle most of it gets gpu_idle, with the same
    number as the per-rank table."""
    res = analyze(shared_traces / NO_STEPS)
    (row,) = res.ranks.to_dict(orient="records")
    assert res.run.steps_analysed == 1 and row["steps"] == 1
    idle = {f.kind: f for f in res.findings}["gpu_idle"]
    assert idle.severity == "high"
    assert idle.cost_ms_per_step == pytest.approx(row["other"] + row["idle"])
    assert idle.cost_ms_per_step > 0.8 * row["step_ms_mean"]
    assert "no ProfilerStep" in idle.title
    (busy,) = res.gpu.kernel_busy
    assert busy.busy_fraction < 0.2 and busy.window_ms == pytest.approx(row["step_ms_mean"])
    # the 2.6 ms before the first GPU event is start-up: outside the window, said apart
    assert busy.startup_ms == pytest.approx(2.64, abs=0.01)
    assert idle.evidence["startup_ms"] == {"0": pytest.approx(2.642, abs=0.001)}
    assert "2.64 ms of start-up before the first GPU event not counted" in idle.title


def test_gpus_listed_but_no_kernels_is_said_once() -> None:
    """HTA's distributed_info_not_found trace lists two A100s but holds only CPU ops."""
    res = analyze(FIXTURES / "hta_gpus_no_kernels")
    said = [w for w in res.warnings if "no GPU kernels" in w]
    assert len(said) == 1
    assert "A100" in said[0] and "analysed as a CPU run" in said[0]
    assert said[0] in res.to_json()["warnings"]
    assert not res.run.has_gpu_trace
    # traces with kernels, and CPU runs that list no GPU, get no such warning
    assert not any("no GPU kernels" in w for w in analyze(KINETO_2021).warnings)


def test_world_of_one_has_no_collective_rows_from_host_calls() -> None:
    """World size 1 on NCCL: DDP still calls c10d::allreduce_ but no kernel runs; those
    host-side call durations are not collectives in any view."""
    path = FIXTURES / "hta_v100_world1"
    (trace,) = load_traces(find_traces(path), warnings=[])
    names = trace.events["name"].astype(str)
    assert names.str.startswith("c10d::").sum() > 5  # the calls are there
    assert not (trace.events["kind"] == "comm").any()  # no comm kernel
    res = analyze(path)
    assert res.run.world_size == 1
    assert len(res.collectives) == 0 and len(res.collective_summary) == 0
    assert res.to_json()["collectives"] == []
    assert (res.ranks["comm_overlapped"] == 0).all() and (res.ranks["comm_exposed"] == 0).all()


@pytest.mark.parametrize("path", [KINETO_2021, FIXTURES / "hta_v100_world1"])
def test_no_amp_on_a_v100_advises_fp16_not_bf16(path: Path) -> None:
    res = analyze(path)
    no_amp = {f.kind: f for f in res.findings}["no_amp"]
    assert "V100" in no_amp.evidence["device"] and no_amp.evidence["compute_capability"] == 7.0
    # it may say the GPU has neither, but must not tell the user to turn them on
    assert "bfloat16" not in no_amp.fix and "bf16_compress" not in no_amp.fix
    assert "allow_tf32" not in no_amp.fix and "set_float32_matmul_precision" not in no_amp.fix
    assert "float16" in no_amp.fix and "GradScaler" in no_amp.fix


def test_overlap_per_rank_in_the_json(shared_traces: Path) -> None:
    """ranks[].comm_comp_overlap_pct is comm_comp_overlap (HTA's, tests/test_crosscheck.py)
    for every rank; null where the rank has no communication."""
    res = analyze(shared_traces / "hta_sampled_2of128")
    rows = res.to_json()["ranks"]
    assert [r["comm_comp_overlap_pct"] for r in rows] == pytest.approx([14.946, 19.926], abs=0.01)
    world1 = analyze(FIXTURES / "hta_v100_world1").to_json()["ranks"]
    assert world1[0]["comm_comp_overlap_pct"] is None


def test_bucket_size_from_the_cpu_ops_elements(shared_traces: Path) -> None:
    """hta_sampled_2of128 runs its float all-reduces as SendRecv ..._int8_t kernels too:
    mean_bucket_mib is the nccl:all_reduce ops' float elements x 4 (it was a quarter)."""
    path = shared_traces / "hta_sampled_2of128"
    elements = [
        math.prod(e["args"]["Input Dims"][0])
        for e in _raw_events(path / "sampled_rank-0.json.gz")
        if e.get("name") == "nccl:all_reduce"
    ]
    bucket = {f.kind: f for f in analyze(path).findings}["bucket_size"]
    expected = sum(elements) * 4 / len(elements) / 2**20
    assert bucket.evidence["mean_bucket_mib"] == pytest.approx(expected, abs=0.001)


def test_html_report_shows_overlap_and_the_no_kernels_warning(tmp_path: Path) -> None:
    from gpudiag.report.html import write_html

    blind = analyze(FIXTURES / "hta_gpus_no_kernels")
    out = write_html([blind, analyze(KINETO_2021)], tmp_path / "r.html")
    text = out.read_text()
    assert (
        "overlap % of comm, waits included" in text
    )  # the per-rank column, as every view names it
    assert "but holds no GPU kernels" in text


def test_gpu_idle_numbers_are_the_tables_columns(shared_traces: Path) -> None:
    """GPU runs: the table's `other` is GPU idle while the host is busy, `idle` GPU idle
    while the host is in no event; the gpu_idle finding gives both, with the table's
    numbers (issue 31: "GPU idle 169.9 ms/step" beside a table of idle 0.22, other
    169.65), and the GPU metrics' idle (no GPU work at all) is data_loading + other + idle
    (Megatron rank 0: 230.5 beside a table idle of 29.86)."""
    res = analyze(shared_traces / "hta_nccl_a100")
    (row,) = res.ranks.to_dict(orient="records")
    idle = {f.kind: f for f in res.findings}["gpu_idle"]
    assert idle.evidence["host_busy_ms_per_step"] == pytest.approx(row["other"], abs=0.001)
    assert idle.evidence["host_idle_ms_per_step"] == pytest.approx(row["idle"], abs=0.001)
    assert idle.cost_ms_per_step == pytest.approx(row["other"] + row["idle"])
    assert f"host busy {row['other']:.2f} ms, host idle {row['idle']:.2f} ms" in idle.title
    megatron = analyze(shared_traces / "astrasim_megatron_tp8")
    table = megatron.ranks.set_index("rank")
    assert len(megatron.gpu.kernel_busy) == 8
    for busy in megatron.gpu.kernel_busy:
        r = table.loc[busy.rank]
        no_gpu_work = r["data_loading"] + r["other"] + r["idle"]
        assert busy.idle_ms_per_step == pytest.approx(no_gpu_work, abs=1e-6), busy.rank
    assert table.loc[0, "idle"] == pytest.approx(29.86, abs=0.01)
    assert megatron.gpu.kernel_busy[0].idle_ms_per_step == pytest.approx(230.51, abs=0.01)


def _without_profiler_steps(src: Path, out_dir: Path) -> Path:
    """The same recorded trace with its ProfilerStep# events left out (nothing else
    changes): a trace profiled without step marks."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    out = out_dir / src.name.removesuffix(".gz")
    out.write_text(json.dumps(doc))
    return out


def test_trace_without_steps_keeps_its_data_wait_and_syncs(tmp_path: Path) -> None:
    """Issue 29: traces without ProfilerStep lost the data wait (`dataloader.steps: 0`,
    no finding beside 41 % data loading) and the syncs (`host_sync` 0). Without steps the
    trace from its first GPU event is one window, as in the breakdown."""
    (src,) = find_traces(KINETO_2021)
    path = _without_profiler_steps(src, tmp_path)
    res = analyze(path)
    (wait,) = res.dataloader.trace
    assert wait.steps == 1 and wait.whole_trace and wait.events == 2
    # the first __next__ (69 ms) runs before the first GPU event: start-up; the second counts
    assert wait.data_ms_per_step == pytest.approx(68.78, abs=0.01)
    stall = {f.kind: f for f in res.findings}["dataloader_stall"]
    assert stall.cost_ms_per_step == pytest.approx(wait.data_ms_per_step)
    assert "no ProfilerStep" in stall.evidence["source"] and "traced" in stall.title
    (sync,) = res.dataloader.host_sync
    assert sync.by_name["cudaStreamSynchronize"].count == 4
    assert sync.count_per_step == 4 and sync.host_blocking_ms_per_step > 0
    assert sync.ms_per_step > 0  # the GPU idle they cause


def test_mtia_device_events_are_device_work() -> None:
    """Issue 29: an MTIA trace with 25,814 device events (category mtia_ccp_events) was
    said to hold "no GPU kernels (CUPTI off?)". An excerpt of it: its 400 device events
    are device work (dma_request: copies), its busy time their union."""
    path = FIXTURES / "hta_mtia_excerpt" / "mtia_rank_0.excerpt.json.gz"
    res = analyze(path)
    assert not any("no GPU kernels" in w for w in res.warnings)
    assert res.run.has_gpu_trace
    (trace,) = res.traces
    ev = trace.events
    device = ev[ev["is_gpu"]]
    assert len(device) == 400
    names = device["name"].astype(str)
    assert set(device.loc[names.str.startswith("dma"), "kind"]) == {"memcpy"}
    assert set(device.loc[~names.str.startswith("dma"), "kind"]) == {"compute"}
    raw = [e for e in _raw_events(path) if e.get("cat") == "mtia_ccp_events"]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in raw)
    covered, reach = 0.0, -math.inf
    for a, b in spans:
        covered += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    (busy,) = res.gpu.kernel_busy
    assert busy.busy_fraction * busy.window_ms == pytest.approx(covered / 1e3, rel=1e-6)


def test_a_data_wait_across_a_step_edge_counts_as_the_breakdown_counts_it(
    shared_traces: Path,
) -> None:
    """param_dlrm_ddp8 rank 3: its DataLoader `__next__` began 0.4 ms before its step's
    ProfilerStep and ended inside it. The breakdown counted the 1.0 ms inside the step as
    data loading; dataloader_stall assigned the event by its start, outside every step,
    and said 0.00 ms for rank 3 (browser probe of issue 31, C). One number per rank."""
    result = analyze(shared_traces / "param_dlrm_ddp8")
    stall = next(f for f in result.findings if f.kind == "dataloader_stall")
    said = stall.evidence["per_rank_data_ms"]
    for row in result.ranks.itertuples(index=False):
        assert said[str(int(row.rank))] == pytest.approx(row.data_loading, abs=2e-3), row.rank
    assert 3 in stall.ranks
    # its step is the named ranks' own, under its own name (not the run's "step")
    assert "step_ms" not in stall.evidence and stall.evidence["step_of_these_ranks_ms"] > 0
