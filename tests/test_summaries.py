"""The summaries-only path (1000-rank runs): a synthetic 1024-rank run built by
bench/scale.py (synthetic by design: it tests scale, not measurement)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis.summaries import analyze_summaries

SCALE = Path(__file__).resolve().parents[1] / "bench" / "scale.py"


def _scale_module():
    spec = importlib.util.spec_from_file_location("gpudiag_bench_scale", SCALE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("scale") / "run1024"
    _scale_module().write_synthetic_run(run, ranks=1024, slow_rank=617)
    return run


def test_1024_ranks_from_summaries_names_the_slow_rank(big_run):
    res = analyze(big_run)  # > 256 ranks: summaries only
    assert res.run.kind == "summaries" and res.run.synthetic is True
    assert len(res.ranks) == 1024
    assert any("summary.json files only" in w for w in res.warnings)
    straggler = next(f for f in res.findings if f.kind == "straggler")
    assert straggler.ranks == [617]
    assert straggler.cost_ms_per_step == pytest.approx(20.0, abs=2.0)
    summary = res.collective_summary.set_index("op")
    assert summary.loc["all_reduce", "count"] == 1024 * 500 * 4
    d = res.to_json()
    assert len(d["ranks"]) == 1024 and d["findings"][0]["kind"] == "straggler"
    json.dumps(d)


def test_failed_rank_in_summaries(tmp_path):
    run = tmp_path / "run"
    _scale_module().write_synthetic_run(run, ranks=4, slow_rank=-1)
    s = json.loads((rundir.rank_dir(run, 3) / rundir.SUMMARY).read_text())
    s["status"] = "failed"
    (rundir.rank_dir(run, 3) / rundir.SUMMARY).write_text(json.dumps(s))
    res = analyze_summaries(run)
    assert res.findings[0].kind == "rank_failed" and res.findings[0].ranks == [3]
    assert not [f for f in res.findings if f.kind == "straggler"]


def test_no_summaries_is_a_clear_error(tmp_path):
    from gpudiag.analysis.result import AnalysisInputError

    (tmp_path / "rank0").mkdir()
    with pytest.raises(AnalysisInputError, match="summary.json"):
        analyze_summaries(tmp_path)


SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


@pytest.mark.skipif(not (SAMPLES / "ddp4_straggler").is_dir(), reason="sample runs not recorded")
def test_real_straggler_run_from_its_summaries_only():
    res = analyze_summaries(SAMPLES / "ddp4_straggler")  # rank 2 sleeps 40 ms per forward
    straggler = next(f for f in res.findings if f.kind == "straggler")
    assert straggler.ranks == [2]
    assert straggler.cost_ms_per_step > 20
