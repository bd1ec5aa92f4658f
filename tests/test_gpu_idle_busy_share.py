"""gpu_idle's evidence: GPU busy and GPU idle add up to the step they are quoted with
(probe 31l, F5). On 8 V100 ranks of a public DLRM trace set (../shared/traces/
param_dlrm_ddp8, windows of 12.5-18.7 ms) the evidence read busy 42.3 % (the unweighted
mean of the per-rank shares), idle 8.82 ms/step (a mean over ranks) and step 15.77 ms:
8.82 of 15.77 is 55.9 % idle, and 42.3 + 55.9 is not 100. Checked on the text every view
prints (terminal, HTML and dashboard share evidence_lines) and against the per-rank busy
time of the GPU metrics' table (busy share x window), summed over ranks."""

from __future__ import annotations

import re
from pathlib import Path

from gpudiag.analysis import analyze
from gpudiag.report.overview import evidence_lines


def _value(lines: list[str], starts: str) -> float:
    line = next(x for x in lines if x.startswith(starts))
    return float(re.search(r": ([\d.]+) ", line + " ").group(1))  # type: ignore[union-attr]


def test_gpu_busy_and_idle_add_up_to_the_step(shared_traces: Path) -> None:
    result = analyze(shared_traces / "param_dlrm_ddp8")
    (idle,) = [f for f in result.findings if f.kind == "gpu_idle"]
    lines = evidence_lines(idle.evidence)
    busy_pct = _value(lines, "GPU busy")
    idle_ms = _value(lines, "GPU idle, data loading included")
    step_ms = _value(lines, "step:")
    assert "all ranks" in next(x for x in lines if x.startswith("GPU busy"))
    assert "mean over ranks" in next(x for x in lines if x.startswith("GPU idle, data"))
    # busy + idle = the step, to the printed digits (0.1 % and 0.01 ms)
    assert abs(busy_pct + 100 * idle_ms / step_ms - 100) < 0.15, (busy_pct, idle_ms, step_ms)
    kb = result.gpu.kernel_busy
    busy_ms = sum(b.busy_fraction * b.window_ms for b in kb)
    window_ms = sum(b.window_ms for b in kb)
    assert round(100 * busy_ms / window_ms, 1) == busy_pct
