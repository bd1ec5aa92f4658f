"""Step windows of GPU traces against torch-tb-profiler's (issue 29): a step ends when
the GPU work it launched ends, and the first step starts after the GPU work queued before
profiling began (kernels launched before the profiler started are not the first step's).

tb-profiler 0.4.3 only recognises the 2021 category spelling ``Runtime``: on today's
traces (``cuda_runtime``) it links no launch to its kernel and falls back to the CPU step
boundaries. The cross-check hands it each trace with its runtime events spelled
``Runtime`` (in memory; nothing else changes), so its own step logic runs."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from gpudiag.analysis.breakdown import step_breakdown, step_windows
from gpudiag.analysis.ingest import load_traces

FIXTURES = Path(__file__).parent / "fixtures"


def _tb_steps(path: Path) -> dict[int, float]:
    data = pytest.importorskip("torch_tb_profiler.profiler.data")
    logging.getLogger("torch_tb_profiler").setLevel(logging.CRITICAL)
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            e["cat"] = "Runtime"
    profile = data.RunProfileData.from_json("w", "s", doc)
    names, costs = profile.steps_names, profile.steps_costs
    return {int(n): c.costs[-1] / 1000 for n, c in zip(names, costs, strict=True)}


def _ours(path: Path) -> dict[int, float]:
    (trace,) = load_traces([path], warnings=[])
    b = step_breakdown(trace)
    return dict(zip(b["step"].astype(int), b["step_ms"].astype(float), strict=True))


CASES = {
    # set: (file, {step: tb-profiler's step ms})
    "kineto_2021_v100": ("worker0.1623143089861.pt.trace.json.gz", {5: 187.95, 6: 175.15}),
    "hta_v100_world1": ("rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", {101: 101.15, 102: 95.74}),
}
SHARED_CASES = {
    "astrasim_megatron_tp8": ("megatron_kineto_1.json.gz", {3: 623.32}),
    "param_dlrm_ddp8": ("worker1_step_12.1694128201556.pt.trace.json.gz", {10: 18.58}),
    "hta_nccl_a100": ("nccl_data.json.gz", {4: 222.44, 5: 219.73, 6: 224.94}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_windows_equal_tb_profilers_on_fixtures(name: str) -> None:
    file, expected = CASES[name]
    path = FIXTURES / name / file
    tb = _tb_steps(path)
    ours = _ours(path)
    assert {k: round(v, 2) for k, v in tb.items()} == expected
    assert ours == pytest.approx(tb, abs=0.005)


@pytest.mark.parametrize("name", sorted(SHARED_CASES))
def test_step_windows_equal_tb_profilers_on_recorded_sets(name: str, shared_traces: Path) -> None:
    file, expected = SHARED_CASES[name]
    path = shared_traces / name / file
    tb = _tb_steps(path)
    assert {k: round(v, 2) for k, v in tb.items()} == expected
    assert _ours(path) == pytest.approx(tb, abs=0.005)


def test_work_queued_before_profiling_is_not_the_first_steps(shared_traces: Path) -> None:
    """DLRM rank 1: GPU work not launched inside the step (its launch is not in the
    profiled step) runs before the step's own first kernel; the step starts when it ends
    (19.90 ms on the CPU side, 18.58 ms from there), so it is not counted as the step's."""
    path = shared_traces / "param_dlrm_ddp8" / "worker1_step_12.1694128201556.pt.trace.json.gz"
    (trace,) = load_traces([path], warnings=[])
    (window,) = step_windows(trace).itertuples()
    (cpu,) = trace.steps.itertuples()
    assert (cpu.end_ns - cpu.start_ns) / 1e6 == pytest.approx(19.90, abs=0.005)
    assert window.start_ns > cpu.start_ns
    ev = trace.events
    gpu = ev["is_gpu"] & ev["kind"].isin(["compute", "comm", "memcpy", "memset"])
    launches = ev.loc[~ev["is_gpu"] & (ev["step"] == 10), "correlation"]
    queued = ev[gpu & ~ev["correlation"].isin(launches)]
    # the step starts exactly where the last such kernel that ends before its own work ends
    assert window.start_ns in set(queued["end_ns"])
    own = ev[gpu & ev["correlation"].isin(launches)]
    assert window.start_ns < own["start_ns"].min()
