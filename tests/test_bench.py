"""`gpudiag bench` on CPU: a tiny real configuration, recorded once, under capture."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.cli import bench as bench_cli
from gpudiag.reference import bench

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_bench(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpudiag",
            "bench",
            "--out",
            str(out),
            "--model",
            "toy",
            "--steps",
            "8",
            "--batch-sizes",
            "16",
            "--nproc-per-node",
            "2",
            "--device",
            "cpu",
            "--profile-steps",
            "3-4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return {"proc": proc, "out": out}


def test_bench_runs_every_cpu_mode_under_capture(tiny_bench: dict) -> None:
    proc, out = tiny_bench["proc"], tiny_bench["out"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[1/2] single-bs16" in proc.stdout and "[2/2] ddp-bs16" in proc.stdout
    assert "no DataParallel rows: nn.DataParallel needs CUDA devices" in proc.stdout
    for name in ("single-bs16", "ddp-bs16"):
        run = rundir.load_run(out / name)
        assert run.manifest["module"] == "gpudiag.reference"  # really under gpudiag trace
        assert (out / name / bench.BENCH_FILE).is_file()
    assert rundir.load_run(out / "ddp-bs16").world_size == 2


def test_bench_numbers_come_from_the_run_directories(tiny_bench: dict) -> None:
    out = tiny_bench["out"]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["kind"] == "gpudiag_bench"
    runs = {r["name"]: r for r in doc["runs"]}
    assert set(runs) == {"single-bs16", "ddp-bs16"}
    for name, row in runs.items():
        steps = rundir.load_run(out / name).steps
        measured = steps[steps["step"] >= bench.WARMUP_STEPS]
        median_ms = float(((measured["end_ns"] - measured["start_ns"]) / 1e6).median())
        assert row["status"] == "ok"
        assert row["median_step_ms"] == pytest.approx(median_ms)
        assert row["samples_per_s"] == pytest.approx(row["global_batch"] / median_ms * 1e3)
        assert row["peak_mem_per_device_mib"] > 10  # a torch process's RSS
        assert row["final_loss"] > 0
    single, ddp = runs["single-bs16"], runs["ddp-bs16"]
    assert (single["global_batch"], ddp["global_batch"]) == (16, 32)
    assert single["speedup"] == pytest.approx(1.0)
    assert ddp["speedup"] == pytest.approx(ddp["samples_per_s"] / single["samples_per_s"])
    assert ddp["scaling_efficiency"] == pytest.approx(ddp["speedup"] / 2)
    assert 0 < ddp["comm_share"] < 1  # gloo all-reduces take real time
    assert single["comm_share"] == 0
    assert ddp["dp_overhead_share"] is None  # no DataParallel on CPU


def test_bench_writes_markdown_csv_and_per_run_json(tiny_bench: dict) -> None:
    out, proc = tiny_bench["out"], tiny_bench["proc"]
    md = (out / "bench.md").read_text()
    assert "| run | mode |" in md and "| ddp-bs16 | ddp | 2 | 16 | 32 |" in md
    assert md.split("\n\n")[2].strip() in proc.stdout  # the printed table is the file's
    with open(out / "bench.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["name"] for r in rows] == ["single-bs16", "ddp-bs16"]
    assert float(rows[1]["samples_per_s"]) > 0
    per_run = json.loads((out / "ddp-bs16" / bench.BENCH_FILE).read_text())
    assert per_run["this_run"] == "ddp-bs16" and len(per_run["runs"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-sizes", "a,b"], "--batch-sizes 'a,b': expected integers"),
        (["--model", "resnet"], "--model 'resnet': choose one of"),
        (["--steps", "2"], "--steps must be more than 2"),
    ],
)
def test_bench_bad_options_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_cli.main(["--out", str(tmp_path / "o"), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bench_refuses_to_overwrite_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "single-bs16").mkdir()
    assert bench_cli.main(["--out", str(tmp_path), "--device", "cpu", "--batch-sizes", "16"]) == 2
    assert "already holds single-bs16" in capsys.readouterr().err


def test_markdown_table_marks_missing_numbers() -> None:
    row = bench.BenchRun("ddp-bs8", "ddp", 8, 2, [], status="failed (exit 1)")
    table = bench.markdown_table([row])
    assert "| ddp-bs8 | ddp | 2 | 8 | n/a |" in table and "failed (exit 1)" in table
