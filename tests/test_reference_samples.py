"""The shipped sample runs load, analyse, and show what was injected when they were
recorded (sample_runs/README.md lists the commands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"
RUNS = ("ddp2_healthy", "ddp4_straggler", "ddp2_dataloader_bound")
MAX_BYTES = 3 * 2**20


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def analysed() -> dict[str, object]:
    return {name: analyze(SAMPLES / name) for name in RUNS}


@pytest.mark.parametrize("name", RUNS)
def test_sample_run_is_a_small_complete_reference_run(name: str) -> None:
    run = rundir.load_run(SAMPLES / name)
    assert run.manifest["module"] == "gpudiag.reference"
    assert run.world_size == len(run.ranks) and set(run.trace_files) == set(run.ranks)
    assert all(s.get("status") == "ok" for s in run.statuses.values())
    assert run.steps.groupby("rank")["step"].count().eq(15).all()
    assert _size(SAMPLES / name) < MAX_BYTES
    assert "--quiet" in run.manifest["argv"]


def _findings(result: object, kind: str) -> list:
    return [f for f in result.findings if f.kind == kind]  # type: ignore[attr-defined]


def test_straggler_run_names_the_slowed_rank(analysed: dict) -> None:
    argv = rundir.load_run(SAMPLES / "ddp4_straggler").manifest["argv"]
    slow_rank = int(argv[argv.index("--slow-rank") + 1])
    slow_ms = float(argv[argv.index("--slow-ms") + 1])
    stragglers = _findings(analysed["ddp4_straggler"], "straggler")
    assert [f.ranks for f in stragglers] == [[slow_rank]]
    assert stragglers[0].severity == "high"
    assert 0.5 * slow_ms < stragglers[0].cost_ms_per_step < 1.5 * slow_ms


def test_dataloader_bound_run_is_found_data_bound(analysed: dict) -> None:
    argv = rundir.load_run(SAMPLES / "ddp2_dataloader_bound").manifest["argv"]
    slow_data_ms = float(argv[argv.index("--slow-data-ms") + 1])
    result = analysed["ddp2_dataloader_bound"]
    top = result.findings[0]
    assert top.kind == "dataloader_stall" and top.severity == "high"
    assert 0.8 * slow_data_ms < top.cost_ms_per_step < 1.5 * slow_data_ms


def test_healthy_run_has_no_straggler_or_data_stall(analysed: dict) -> None:
    result = analysed["ddp2_healthy"]
    assert _findings(result, "straggler") == []  # symmetric job: no rank is blamed
    assert all(f.severity == "low" for f in _findings(result, "dataloader_stall"))
    assert not [f for f in result.findings if f.severity == "high"]  # healthy: nothing high


def test_bench_sample_holds_the_table_and_its_runs() -> None:
    bench_dir = SAMPLES / "bench_cpu"
    doc = json.loads((bench_dir / "bench.json").read_text())
    names = [r["name"] for r in doc["runs"]]
    assert names == ["single-bs32", "ddp-bs32", "single-bs128", "ddp-bs128"]
    for row in doc["runs"]:
        assert row["status"] == "ok" and row["samples_per_s"] > 0
        run = rundir.load_run(bench_dir / row["name"])
        assert (
            json.loads((bench_dir / row["name"] / "bench.json").read_text())["this_run"]
            == row["name"]
        )
        assert run.steps["step"].nunique() == doc["steps"]
    assert "| ddp-bs128 | ddp | 2 | 128 | 256 |" in (bench_dir / "bench.md").read_text()
