"""What-if projections: consistent with the findings on the shipped runs, and checked
against re-recorded jobs (the change made for real) on gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.whatif import SCENARIOS, mean_step_ms
from gpudiag.cli import whatif as whatif_cli

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_runs"


@pytest.mark.parametrize("name", ["ddp4_straggler", "ddp2_dataloader_bound", "ddp2_healthy"])
def test_projection_is_the_findings_cost(name: str) -> None:
    """Every view shows one number: a scenario's saving is its finding's cost."""
    result = analyze(SAMPLES / name)
    step = mean_step_ms(result.ranks)
    kinds = {s.name: s.finding_kind for s in SCENARIOS}
    for p in result.whatif:
        costs = [f.cost_ms_per_step for f in result.findings if f.kind == kinds[p.scenario]]
        assert p.saving_ms == pytest.approx(max(costs))
        assert p.projected_step_ms == pytest.approx(step - p.saving_ms)
        assert p.projected_low_ms <= p.projected_high_ms
        assert p.assumptions
    projected = {p["scenario"] for p in result.to_json()["whatif"]}
    assert projected == {p.scenario for p in result.whatif}


def test_whatif_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert whatif_cli.main([str(SAMPLES / "ddp4_straggler"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    straggler = next(p for p in out["whatif"] if p["scenario"] == "straggler_fixed")
    assert straggler["ranks"] == [2]
    assert 0 < straggler["projected_step_ms"] < out["step_ms"]
    assert whatif_cli.main([str(SAMPLES / "ddp4_straggler")]) == 0
    assert "straggler_fixed" in capsys.readouterr().out
