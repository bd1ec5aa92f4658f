"""What-if projections: consistent with the findings on the shipped runs, and checked
against re-recorded jobs (the change made for real) on gloo."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.whatif import SCENARIOS, last_bucket_ms, mean_step_ms
from gpudiag.cli import whatif as whatif_cli

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_runs"
SUITE_SCRIPT = Path(__file__).parent / "scripts" / "suite_train.py"
sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from coll_launch import free_port  # noqa: E402


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


BASE = ["--steps", "40", "--width", "32", "--depth", "2", "--batch", "8",
        "--opt-ms", "30", "--opt-ranks", "all"]  # fmt: skip
VARIANTS = {
    "base": [],
    "straggler": ["--fwd-ms", "30", "--fwd-ranks", "1"],
    "slow_data": ["--data-ms", "30", "--data-ranks", "all"],
}


def _record(out: Path, extra: list[str]) -> None:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2",
        "--master-port", str(free_port()), "--out", str(out), "--no-lint",
        "--profile-steps", "10-14", str(SUITE_SCRIPT), *BASE, *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_projections_match_the_fixed_job(tmp_path: Path) -> None:
    """Record a job with one slow rank and one with a slow DataLoader, predict the fix,
    then record the job with the fix (the same job without the slowdown), alternated twice.
    Every step also sleeps 30 ms on all ranks, so the step is not dominated by compute that
    two cores shared by two ranks make noisy."""
    predicted: dict[str, list[float]] = {"straggler": [], "slow_data": []}
    actual: list[float] = []
    scenario = {"straggler": "straggler_fixed", "slow_data": "dataloader_fixed"}
    for rep in range(2):
        for name, extra in VARIANTS.items():
            out = tmp_path / f"{name}{rep}"
            _record(out, extra)
            result = analyze(out)
            if name == "base":
                # the fixed job's step as the projection measures it: the steady step of
                # every recorded step (the profiled window is slowed by the profiler)
                assert result.run.steady_step_ms is not None
                actual.append(result.run.steady_step_ms)
                continue
            projection = next(p for p in result.whatif if p.scenario == scenario[name])
            predicted[name].append(projection.projected_step_ms)
    fixed = statistics.median(actual)
    for name, values in predicted.items():
        error = statistics.median(values) / fixed - 1
        assert abs(error) <= 0.10, (name, values, actual)
