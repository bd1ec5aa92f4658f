"""Capture at the edges (issue 28, F5-F7), on real 2-rank gloo jobs: the run directory
deleted while the job writes it, an ``--out`` with a newline, a file size limit
(``ulimit -f``). Nothing is lost without the record saying so, and nothing is blamed on
the wrong cause."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from tests.traced_jobs import start_trace, wait_for_steps

SCRIPTS = Path(__file__).parent / "scripts"
DDP_SCRIPT = SCRIPTS / "capture_ddp_mlp.py"
JOB_TIMEOUT_S = 240


def _analyze(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run)],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )


# --------------------------------------------------------------------------- fast


def test_warning_lines_escape_control_characters() -> None:
    assert rundir.one_line("/tmp/x/o\nnl2\x1b: gone") == "/tmp/x/o\\nnl2\\x1b: gone"
    assert rundir.one_line("plain /tmp/x") == "plain /tmp/x"
    assert rundir.has_control_chars("a\tb") and not rundir.has_control_chars("a b")


def test_out_with_a_newline_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "o\nnl2"
    proc = start_trace(["--out", str(out), str(DDP_SCRIPT)], tmp_path)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines() == [
        "gpudiag: trace: --out must not contain a newline or other control characters"
    ]
    assert not out.exists()


def test_analyze_warnings_naming_a_path_with_a_newline_are_one_line(tmp_path: Path) -> None:
    run = tmp_path / "o\nnl2"
    shutil.copytree(Path(__file__).parents[1] / "sample_runs" / "ddp2_healthy", run)
    steps = rundir.table_path(rundir.rank_dir(run, 0), rundir.STEPS)
    with open(steps, "a") as fh:
        fh.write("{not json\n")
    done = _analyze(run)
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    assert warnings and all(line.startswith("gpudiag: ") for line in warnings), done.stderr
    assert any("o\\nnl2" in line and "malformed" in line for line in warnings), done.stderr


# --------------------------------------------------------------------------- real jobs


@pytest.mark.slow
def test_run_directory_deleted_mid_run_is_marked_incomplete(tmp_path: Path) -> None:
    out = tmp_path / "wd"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--no-profile", str(DDP_SCRIPT),
         "--steps", "60", "--sleep", "0.05", "--width", "16", "--depth", "1"],
        tmp_path,
    )  # fmt: skip
    wait_for_steps(out, 2, 3, proc, JOB_TIMEOUT_S)
    shutil.rmtree(out / "rank1")
    time.sleep(1.0)
    shutil.rmtree(out)
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, stderr[-3000:]  # the job itself is untouched
    manifest = json.loads((out / "manifest.json").read_text())
    reasons = manifest["incomplete"]
    assert reasons, manifest
    text = "\n".join(reasons)
    assert f"{out} was deleted while the run wrote it" in text
    assert "rank1" in text and "steps.jsonl was deleted while the run wrote it" in text
    assert "run incomplete" in stderr
    done = _analyze(out)
    assert "deleted while the run wrote it" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kib", [60, 100])
def test_a_file_size_limit_runs_the_job_and_names_the_limit(tmp_path: Path, kib: int) -> None:
    """``ulimit -f``: the job runs as it would without gpudiag (before, 60 KiB was
    refused as "not enough free space"); the traces (> 100 KiB of JSON) do not fit, and
    the record says why: the file size limit, not "disk full?"."""
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--profile-steps", "2-6", str(DDP_SCRIPT),
         "--steps", "12", "--width", "64", "--depth", "2"],
        tmp_path,
        fsize=kib * 1024,
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, stderr[-3000:]
    assert "not enough free space" not in stderr
    assert "disk full" not in stderr
    statuses = [json.loads((rundir.rank_dir(out, r) / rundir.STATUS).read_text()) for r in (0, 1)]
    assert [s["status"] for s in statuses] == ["ok", "ok"]
    assert all(s["steps_completed"] == 12 for s in statuses)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    for s in statuses:
        assert "File too large" in s["profile_error"] and "RLIMIT_FSIZE" in s["profile_error"]
    text = "\n".join(manifest["incomplete"])
    assert "RLIMIT_FSIZE" in text and "disk full" not in text, text
    assert all(f"rank {r}: " in text for r in (0, 1)), text
    assert "RLIMIT_FSIZE" in _analyze(out).stderr


def test_default_out_of_a_script_named_with_a_newline_has_none() -> None:
    """The default --out is built from the script's name: a control character there
    becomes _ (an --out given with one is refused; torch cannot export under it)."""
    from gpudiag.capture.run_claim import default_out

    out = default_out({"script": "/tmp/x\ny\x1b.py"})
    assert out.parent == Path("gpudiag_runs") and out.name.startswith("x_y_-")
    assert not rundir.has_control_chars(str(out))
