"""The ops a straggler's title names as where its extra compute goes are timed in the
profiled steps, which the profiler slows; the extra compute they split is every steady
step's. Probe 31m (a run it recorded: rank 0 with 40 extra matmuls per step) read "rank 0
spends 317.16 ms ... more (most in aten::mm +396.95 ms, ...)": a part larger than the
whole. Each part is now at most the whole, and the window is named."""

from __future__ import annotations

import re
from pathlib import Path

from gpudiag.analysis import analyze

RUN = Path(__file__).parent / "fixtures" / "extra_compute_rank0" / "run"


def test_named_ops_never_add_up_to_more_than_the_extra_compute() -> None:
    result = analyze(RUN)
    (straggler,) = [f for f in result.findings if f.kind == "straggler"]
    assert straggler.ranks == [0]
    evidence = straggler.evidence
    extra = float(evidence["extra_ms_per_step"]["compute"])
    assert evidence["ops_window"] == "profiled steps"
    assert sum(evidence["ops_extra_ms_per_step"].values()) > extra  # the case in point
    most_in = straggler.title.split("(most in ", 1)[1].split(")", 1)[0]
    assert "in the profiled steps" in most_in
    parts_ms = [float(v) for v in re.findall(r"\+([0-9.]+) ms", most_in)]
    shares = [float(v) for v in re.findall(r" ([0-9]+) %", most_in)]
    assert sum(parts_ms) <= extra
    assert shares and sum(shares) <= 100 + len(shares)  # rounding
    assert "aten::mm" in most_in
