"""The summaries-only path (1000-rank runs): a synthetic 1024-rank run built by
bench/scale.py (synthetic by design: it tests scale, not measurement)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis.summaries import analyze_summaries, step_stats_from_rows

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


# --------------------------------------------------------------------------- killed ranks

STRAGGLER_RUN = SAMPLES / "ddp4_straggler"  # 4 gloo ranks, rank 2 sleeps 40 ms per forward
NO_SUMMARY = frozenset({rundir.SUMMARY, rundir.STATUS})  # what a SIGKILLed rank never writes


def _replicate_ranks(ranks: int, run: Path, killed: set[int]) -> Path:
    """``run`` with ``ranks`` ranks, rank r made of links to the recorded rank r % 4's
    files (as tests/copied_ranks.py links traces), the manifest's world size set to
    ``ranks``. The ``killed`` ranks keep their tables but have no summary.json and no
    status.json, as a rank SIGKILLed mid-run leaves them."""
    sources = rundir.list_ranks(STRAGGLER_RUN)
    run.mkdir()
    manifest = json.loads((STRAGGLER_RUN / rundir.MANIFEST).read_text())
    (run / rundir.MANIFEST).write_text(json.dumps({**manifest, "world_size": ranks}))
    for r in range(ranks):
        source = rundir.rank_dir(STRAGGLER_RUN, sources[r % len(sources)])
        target = rundir.rank_dir(run, r)
        target.mkdir()
        for f in source.iterdir():
            if not (r in killed and f.name in NO_SUMMARY):
                (target / f.name).symlink_to(f)
    return run


def _source_summary(rank: int) -> dict:
    return json.loads((rundir.rank_dir(STRAGGLER_RUN, rank % 4) / rundir.SUMMARY).read_text())


def test_steps_table_gives_the_summary_step_statistics() -> None:
    for r in rundir.list_ranks(STRAGGLER_RUN):
        table = rundir.table_path(rundir.rank_dir(STRAGGLER_RUN, r), rundir.STEPS)
        rows = list(rundir.iter_jsonl(table, schema=rundir.STEPS))
        assert step_stats_from_rows(rows) == _source_summary(r)["steps"]


def test_300_sigkilled_ranks_are_analysed_from_their_steps_tables(tmp_path: Path) -> None:
    run = _replicate_ranks(300, tmp_path / "run300", killed=set(range(300)))
    res = analyze(run)  # > 256 ranks: the summaries path, which refused this run before
    assert res.run.kind == "summaries" and res.run.rank_statuses == {"unknown": 300}
    assert res.ranks["rank"].tolist() == list(range(300))
    for row in res.ranks.itertuples():
        steps = _source_summary(row.rank)["steps"]
        assert (row.steps, row.step_ms_mean) == (steps["count"], steps["mean_ms"])
        assert row.data_loading == steps["data_ms_mean"]
    assert any("300 rank(s) without a readable summary.json" in w for w in res.warnings)
    # no collective totals: no straggler can be named, and none is made up
    assert not [f for f in res.findings if f.kind == "straggler"]
    assert res.collective_summary.empty


def test_a_few_killed_ranks_stay_in_the_table_beside_the_summaries(tmp_path: Path) -> None:
    killed = {5, 130, 299}
    run = _replicate_ranks(300, tmp_path / "run300", killed=killed)
    res = analyze(run)
    assert len(res.ranks) == 300
    assert res.run.rank_statuses == {"ok": 297, "unknown": 3}
    assert any("(ranks 5, 130, 299)" in w for w in res.warnings)
    straggler = next(f for f in res.findings if f.kind == "straggler")
    # the copies of the slowed rank 2 that left a summary; rank 130 (130 % 4 == 2) was
    # killed, so its collective time is unknown
    assert straggler.ranks == [r for r in range(300) if r % 4 == 2 and r not in killed]


def test_a_killed_rank_with_status_json_keeps_its_status(tmp_path: Path) -> None:
    run = _replicate_ranks(4, tmp_path / "run4", killed={1})
    status = {"rank": 1, "status": "failed", "exc_type": "RuntimeError", "message": "boom"}
    (rundir.rank_dir(run, 1) / rundir.STATUS).write_text(json.dumps(status))
    res = analyze_summaries(run)
    assert res.run.rank_statuses == {"ok": 3, "failed": 1}
    failed = next(f for f in res.findings if f.kind == "rank_failed")
    assert failed.ranks == [1] and "RuntimeError: boom" in failed.title


def test_a_run_without_summaries_or_steps_tables_is_refused(tmp_path: Path) -> None:
    from gpudiag.analysis.result import AnalysisInputError

    rundir.rank_dir(tmp_path, 0).mkdir()
    rundir.table_path(rundir.rank_dir(tmp_path, 0), rundir.STEPS).write_text("")  # no step
    with pytest.raises(AnalysisInputError, match="summary.json or rank\\*/steps table"):
        analyze_summaries(tmp_path)
