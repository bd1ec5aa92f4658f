"""compare() on the shipped sample runs (real gloo recordings in sample_runs/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.compare import COMPARE_METRICS, compare

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


@pytest.mark.skipif(not (SAMPLES / "ddp2_healthy").is_dir(), reason="sample runs not recorded")
def test_dataloader_bound_run_against_the_healthy_one():
    healthy = analyze(SAMPLES / "ddp2_healthy")
    slow = analyze(SAMPLES / "ddp2_dataloader_bound")
    cmp = compare(healthy, slow)
    table = cmp.table.set_index("metric")
    assert list(table.index) == list(COMPARE_METRICS)
    # the DataLoader of B takes ~30 ms per batch more (sample_runs/README.md)
    assert 15 < table.loc["data_loading", "delta"] < 60
    assert table.loc["data_loading", "delta"] == pytest.approx(
        table.loc["data_loading", "b"] - table.loc["data_loading", "a"]
    )
    assert "dataloader_stall:high" in cmp.findings_b
    assert cmp.to_json()["metrics"][0]["metric"] == "step_ms_mean"
