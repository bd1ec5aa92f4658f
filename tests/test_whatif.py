"""What-if projections: consistent with the findings on the shipped runs, and checked
against gloo jobs recorded with the change made for real (tests/fixtures/whatif_fixes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.whatif import SCENARIOS, last_bucket_ms, mean_step_ms
from gpudiag.cli import whatif as whatif_cli

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_runs"


@pytest.mark.parametrize("name", ["ddp4_straggler", "ddp2_dataloader_bound", "ddp2_healthy"])
def test_projection_is_the_findings_cost(name: str) -> None:
    """Every view shows one number: a scenario's saving is its finding's cost (the
    realistic bucketing gain: at most that, the cost less the last bucket's all-reduce)."""
    result = analyze(SAMPLES / name)
    # projected from the steady step of every recorded step (the headline step time)
    step = result.run.steady_step_ms
    assert step is not None and step != pytest.approx(mean_step_ms(result.ranks))
    kinds = {s.name: s.finding_kind for s in SCENARIOS}
    for p in result.whatif:
        costs = [f.cost_ms_per_step for f in result.findings if f.kind == kinds[p.scenario]]
        if p.scenario == "comm_bucketed":
            remaining = last_bucket_ms(result.collectives.frame())
            assert remaining is not None and 0 < p.saving_ms < max(costs)
            assert p.saving_ms == pytest.approx(max(costs) - remaining)
        else:
            assert p.saving_ms == pytest.approx(max(costs))
        assert p.projected_step_ms == pytest.approx(step - p.saving_ms)
        assert p.projected_low_ms <= p.projected_high_ms
        assert p.assumptions
    projected = {p["scenario"] for p in result.to_json()["whatif"]}
    assert projected == {p.scenario for p in result.whatif}


def test_html_report_shows_the_projections() -> None:
    from gpudiag.report import numbers
    from gpudiag.report.html import render_html

    result = analyze(SAMPLES / "ddp4_straggler")
    page = render_html([result])
    assert "What if: projected step time per fix" in page
    straggler = next(p for p in result.whatif if p.scenario == "straggler_fixed")
    # the one number formatter of every view (gpudiag/report/numbers.py)
    assert f"<td>{numbers.num(straggler.projected_step_ms)}</td>" in page


def test_whatif_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert whatif_cli.main([str(SAMPLES / "ddp4_straggler"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    straggler = next(p for p in out["whatif"] if p["scenario"] == "straggler_fixed")
    assert straggler["ranks"] == [2]
    assert 0 < straggler["projected_step_ms"] < out["step_ms"]
    assert whatif_cli.main([str(SAMPLES / "ddp4_straggler")]) == 0
    assert "straggler_fixed" in capsys.readouterr().out


FIXES = Path(__file__).parent / "fixtures" / "whatif_fixes"


def test_projections_match_the_fixed_job() -> None:
    """On jobs recorded here (tests/fixtures/whatif_fixes, `bench/whatif_fixes.py --reps 1`):
    one with a slow rank (30 ms more forward on rank 1), one with a slow DataLoader (30 ms
    per batch, every rank), and the job with the fix made (the same job without the
    slowdown), 2 gloo ranks, every step sleeping 30 ms. The projected step of each fix is
    within 10 % of the fixed job's steady step (every recorded step: the profiled window
    is slowed by the profiler), and so is the step less the finding's cost.
    `python bench/whatif_fixes.py` re-records them side by side, several times."""
    fixed = analyze(FIXES / "base").run.steady_step_ms
    assert fixed is not None
    for name, scenario, kind in (
        ("straggler", "straggler_fixed", "straggler"),
        ("slow_data", "dataloader_fixed", "dataloader_stall"),
    ):
        result = analyze(FIXES / name)
        projection = next(p for p in result.whatif if p.scenario == scenario)
        (finding,) = [f for f in result.findings if f.kind == kind]
        assert finding.severity == "high" and 0.8 * 30 <= finding.cost_ms_per_step <= 1.2 * 30
        assert result.run.steady_step_ms is not None
        assert result.run.steady_step_ms > 1.5 * fixed  # the slowdown is there to project
        assert projection.projected_step_ms == pytest.approx(fixed, rel=0.10), name
