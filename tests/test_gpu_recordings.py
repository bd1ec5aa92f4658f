"""gpudiag's own GPU recordings: tests/fixtures/gpu_runs (README.md there says how and
where they were recorded: one H200, torch 2.11, NCCL 2.28, by tools/gpu_session.sh).
Each test states what the real data showed and fails on the code before its fix."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis.findings import GLOO_ON_GPU_FIX

GPU_RUNS = Path(__file__).parent / "fixtures" / "gpu_runs"
RECORDINGS = sorted(p.name for p in GPU_RUNS.iterdir() if rundir.is_run_dir(p))


def _check_module():
    path = Path(__file__).resolve().parents[1] / "tools" / "gpu_validate_check.py"
    spec = importlib.util.spec_from_file_location("gpu_validate_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results() -> dict:
    return {name: analyze(GPU_RUNS / name) for name in RECORDINGS}


def test_the_recordings_are_there() -> None:
    assert {"single_gpu", "ddp_nccl_ws1", "gloo_cuda_2rank", "dp_two_replicas_one_gpu"} <= set(
        RECORDINGS
    )
    assert {"big_fp32", "big_bf16", "hf_trainer_gpu", "lightning_gpu"} <= set(RECORDINGS)


def test_gpu_validate_verdict_passes_on_the_recordings() -> None:
    check = _check_module()
    failed = [
        (name, what, detail)
        for name, expect in check.EXPECTED.items()
        for what, ok, detail in check.check_run(GPU_RUNS / name, expect)
        if not ok
    ]
    assert failed == []


def test_every_run_is_read_on_its_device(results) -> None:
    for name, res in results.items():
        assert res.run.has_gpu_trace, name
        assert "NVIDIA H200" in res.run.devices, name
        assert res.run.status == "ok", name


def test_no_finding_costs_more_than_the_step(results) -> None:
    """A fix cannot give back more than the step. The HF Trainer run's gpu_idle said
    17.36 ms/step of a 12.57 ms steady step: its window's share, not scaled to the step."""
    for name, res in results.items():
        step = res.run.steady_step_ms
        assert step, name
        for f in res.findings:
            assert f.cost_ms_per_step <= step * 1.001, (name, f.kind, f.cost_ms_per_step, step)


def test_nccl_calls_have_gpu_times_not_the_watchdog_stamps() -> None:
    """NCCL keeps its own Flight Recorder ring (the generic dump left collectives.jsonl
    empty), and its 'discovered' stamps are the watchdog's polls (start and end 0.5 us
    apart, 93 ms after the enqueue): only duration_ms (CUDA events) is the call's time."""
    coll = rundir.load_run(GPU_RUNS / "ddp_nccl_ws1").collectives
    reduces = coll[coll["op"] == "all_reduce"]
    assert len(reduces) >= 2 * 7  # DDP: 2 buckets' all-reduce per step, 8 steps
    assert coll["start_ns"].isna().all() and coll["end_ns"].isna().all()
    timed = reduces["gpu_duration_ns"].dropna()
    assert len(timed) >= len(reduces) - 1
    # 1 MiB on one rank: a copy on the GPU, tens of microseconds, never the poll interval
    assert 0 < np.median(timed) < 1e6
    assert set(reduces["in_bytes"]) >= {1071144}


def test_nccl_calls_listed_though_one_rank_launches_no_kernel(results) -> None:
    summary = results["ddp_nccl_ws1"].collective_summary
    row = summary[summary["op"] == "all_reduce"].iloc[0]
    assert row["count"] == 15 and row["bytes"] == pytest.approx(1071144, rel=0.01)


def test_host_running_ahead_of_the_gpu_does_not_shrink_the_step(results) -> None:
    """big_fp32 never waits for the GPU: the host's steps took 2.0 ms while the GPU took
    14.0 ms per step; the steady step was 2.03 ms and the amp what-if promised a 0 ms
    step (100 % saved)."""
    res = results["big_fp32"]
    host = rundir.load_run(GPU_RUNS / "big_fp32").steps
    host_ms = ((host["end_ns"] - host["start_ns"]) / 1e6).median()
    window = float(res.ranks["step_ms_median"].iloc[0])
    assert host_ms < window / 4
    assert res.run.steady_step_ms == pytest.approx(window, rel=0.05)
    assert res.run.steady_step_basis == "gpu"
    assert results["big_bf16"].run.steady_step_basis == "host"
    # the GEMMs of the profiled steps only: 6.2 steps' kernels were in the trace (the
    # host ran ahead), and "17.15 ms per step of fp32 matrix multiplies" was said
    no_amp = next(f for f in res.findings if f.kind == "no_amp")
    assert no_amp.evidence["fp32_gemm_ms_per_step"] <= window
    amp = next(s for s in res.whatif if s.scenario == "amp")
    # the projection never promises more than bf16 gave on the same job (big_bf16)
    measured_bf16 = float(results["big_bf16"].ranks["step_ms_median"].iloc[0])
    assert measured_bf16 <= amp.projected_step_ms < res.run.steady_step_ms


def test_amp_detected_from_the_kernels(results) -> None:
    kinds = {name: {f.kind for f in res.findings} for name, res in results.items()}
    assert "no_amp" in kinds["big_fp32"]
    assert "no_amp" not in kinds["big_bf16"] and "no_amp" not in kinds["single_gpu_bf16"]


def test_gloo_on_cuda_tensors_counts_gloo_transfers_as_communication(results) -> None:
    """gloo moves CUDA tensors through the host on its own threads: its gloo:all_reduce
    ranges held ~1.8 ms of a 6.7 ms step with no GPU event, and the report said comm 0,
    GPU idle, 'feed it faster'."""
    res = results["gloo_cuda_2rank"]
    assert (res.ranks["comm_exposed"] > 0.5).all()
    exposed = next(f for f in res.findings if f.kind == "exposed_communication")
    assert exposed.fix.startswith(GLOO_ON_GPU_FIX)
    for name in ("ddp_nccl_ws1", "lightning_gpu"):  # NCCL: no such advice
        assert not any(f.fix.startswith(GLOO_ON_GPU_FIX) for f in results[name].findings)


def test_dataparallel_stages_on_the_cuda_recording(results) -> None:
    """The profiler records no op of DataParallel's replica threads (only their kernel
    launches): parallel_apply read 0.00 ms. It is the main thread's wait between the
    replicate and the gather."""
    res = results["dp_two_replicas_one_gpu"]
    dp = res.dataparallel
    assert dp is not None and not dp.on_cpu
    stages = dp.stage_ms_per_step
    assert stages["replicate"] > 0 and stages["gather"] > 0 and stages["reduce_add"] > 0
    assert dp.stage_events["parallel_apply"] == dp.forward_calls
    assert 0 < stages["parallel_apply"] < dp.forward_ms_per_step
    assert 0 < (dp.projected_ddp_step_ms or 0) < res.run.steady_step_ms
    finding = next(f for f in res.findings if f.kind == "dataparallel_overhead")
    assert finding.cost_ms_per_step == pytest.approx(dp.overhead_ms_per_step, rel=0.05)


def test_gpu_health_on_the_nvml_recording(results) -> None:
    res = results["single_gpu"]
    samples = res.gpu_samples
    assert len(samples) and samples["util_gpu"].notna().any()
    assert samples["mem_total"].max() > samples["mem_used"].max() > 0
    assert res.gpu.kernel_busy and res.gpu.nvml
    nvml = res.gpu.nvml[0]
    assert 0 < (nvml.power_w_mean or 0) < 700 and (nvml.sm_clock_mhz_mean or 0) > 0
    assert not {"dp_on_cpu", "gpu_throttled"} & {f.kind for f in res.findings}


def test_framework_scripts_on_the_gpu(results) -> None:
    for name in ("hf_trainer_gpu", "lightning_gpu"):
        res = results[name]
        assert res.run.backend == "nccl" and res.run.world_size == 1, name
        assert res.run.steady_steps and res.run.steady_steps >= 20, name
    coll = rundir.load_run(GPU_RUNS / "lightning_gpu").collectives
    assert (coll["op"] == "all_reduce").sum() >= 25  # Lightning's DDP, one bucket a step


def test_each_flight_recorder_ring_keeps_its_own_record_ids(tmp_path: Path, monkeypatch) -> None:
    """NCCL's ring and the generic (gloo) ring number their records from 0 each: one
    watermark for both dropped the second ring's first records as already written.
    The generic ring is a real single-rank gloo group's; the NCCL binding, absent from
    CPU builds, returns that ring's entries renamed (record ids 0.. again)."""
    import orjson
    import torch
    import torch.distributed as dist

    from gpudiag.capture import collectives

    c10d = torch._C._distributed_c10d
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
        generic = orjson.loads(c10d._dump_fr_trace_json(True, False))
    finally:
        dist.destroy_process_group()
    entries = generic["entries"]
    assert [e["record_id"] for e in entries][:3] == [0, 1, 2]
    # NCCL entries are written once completed (gloo's at once): these are
    nccl = [
        dict(e, profiling_name="nccl:all_reduce", duration_ms=0.01, state="completed")
        for e in entries
    ]
    monkeypatch.setattr(
        c10d,
        "_dump_nccl_trace_json",
        lambda *a: orjson.dumps({"entries": nccl}),
        raising=False,
    )
    rings = collectives.dump_flight_recorder_rings()
    assert set(rings) == {"nccl", "generic"}
    recorder = collectives.CollectiveRecorder(tmp_path, 0)
    rows = [r for ring, e in rings.items() for r in recorder._new_rows(e, ring)]
    assert len(rows) == 2 * len(entries)
    assert recorder.watermark("nccl") == recorder.watermark("generic") == len(entries) - 1
    timed = [r["gpu_duration_ns"] for r in rows if r["gpu_duration_ns"] is not None]
    assert timed == [10_000] * len(entries)
    assert all(r["start_ns"] is None and r["end_ns"] is None for r in rows)


def test_the_verdict_adds_up_in_one_window(results) -> None:
    """The Overview's verdict gave the steady-step cost beside the profiled window's
    host-busy and host-idle parts (13.22 = 7.07 + 11.31 read wrong); it names the window
    those parts are of."""
    from gpudiag.report import overview

    res = results["hf_trainer_gpu"]
    head = overview.verdict(res).headline
    idle = next(f for f in res.findings if f.kind == "gpu_idle")
    window = idle.evidence["window_step_ms"]
    assert f"of the {window:.2f} ms profiled window" in head, head


def test_a_finding_that_gives_nothing_back_per_step_says_no_ms_back(results) -> None:
    """A one-off (a start-up, cost 0) as the top finding read "up to 0.00 ms/step back"
    (probe 31i N5)."""
    import dataclasses

    from gpudiag.analysis.findings import Finding
    from gpudiag.report import overview

    res = results["single_gpu"]
    once = Finding(
        kind="dataloader_startup",
        severity="high",
        cost_ms_per_step=0.0,
        ranks=[0],
        title="The first batch waited 5400 ms for the DataLoader's workers to start",
        evidence={},
        fix="persistent_workers=True",
    )
    head = overview.verdict(dataclasses.replace(res, findings=[once])).headline
    assert "back" not in head and "0.00" not in head, head


def test_nvml_summary_is_of_the_training_steps(results) -> None:
    """The whole run's mean (start-up, exit) read an H200 running big_fp32's GEMMs as
    2.5 % busy at 116 W (probe 32)."""
    res = results["big_fp32"]
    nvml = res.gpu.nvml[0]
    samples = res.gpu_samples
    assert nvml.over == "steps" and nvml.samples < len(samples)
    assert (nvml.util_gpu_mean or 0) > 3 * float(samples["util_gpu"].mean())
    assert (nvml.power_w_mean or 0) > float(samples["power_w"].mean())


def test_metric_charts_are_svg_for_a_runs_worth_of_samples(results) -> None:
    """11 WebGL charts on the GPU metrics view: the browser's WebGL contexts ran out and
    the utilisation and SM-clock charts were blank (probe 32)."""
    from gpudiag.report import figures

    samples = results["single_gpu"].gpu_samples
    fig = figures.gpu_metric_figure(samples, "util_gpu", "%")
    assert fig.data and all(t.type == "scatter" for t in fig.data)


def test_a_sync_point_is_counted_once(results) -> None:
    """The HF Trainer's `.item()` is aten::item around aten::_local_scalar_dense around
    cudaStreamSynchronize: "11 per step" for 5 sync points (probe 32)."""
    (sync,) = results["hf_trainer_gpu"].dataloader.host_sync
    assert sync.by_name["aten::item"].count == 15  # 5 per profiled step, 3 steps
    assert sync.count_per_step == 5
