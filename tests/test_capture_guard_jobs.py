"""The capture side never becomes the failure, on real gloo jobs: a disk that fills up
under a 2-rank DDP job (a real 640 KiB tmpfs; needs root to mount, skipped otherwise), the
launcher SIGKILLed mid-run, two launches at once, Ctrl-C to a 2-rank job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudiag import rundir
from tests.traced_jobs import mounted_tmpfs, start_trace, table_lines, wait_for_steps

SCRIPTS = Path(__file__).parent / "scripts"
DDP_SCRIPT = SCRIPTS / "capture_ddp_mlp.py"
SINGLE_SCRIPT = SCRIPTS / "capture_single.py"
STRESS_SCRIPT = SCRIPTS / "stress_regions.py"
JOB_TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", "640k")


@pytest.fixture
def nearly_full_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", "48k")


def test_a_disk_too_full_to_record_the_end_is_refused_at_start(
    nearly_full_disk: Path, tmp_path: Path
) -> None:
    """Issue 28: with 48 KiB free the manifest used to stay `running` (readers said
    launcher_lost) and stdout "run ok ... 0 rank(s)": now one line, exit 2, no job."""
    out = nearly_full_disk / "run"
    proc = start_trace(["--out", str(out), "--no-lint", str(SINGLE_SCRIPT)], tmp_path)
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 2, (stdout, stderr)
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "not enough free space to record the run" in lines[0], lines
    assert "KiB free" in lines[0] and "ARGV" not in stdout  # the script never started
    assert not out.exists() or not any(out.iterdir())


def test_a_nearly_full_disk_is_said_at_start_and_the_job_runs(
    small_disk: Path, tmp_path: Path
) -> None:
    """Probe 28i, F2: on a nearly full filesystem gpudiag's records take room the job may
    need (a checkpoint that fits under plain python failed with ENOSPC under gpudiag), and
    nothing said so. The launcher now says it in one line, naming --out, and the job runs."""
    out = small_disk / "run"
    proc = start_trace(["--out", str(out), "--no-lint", str(SINGLE_SCRIPT)], tmp_path)
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, (stdout, stderr)
    said = [line for line in stderr.splitlines() if "free on its filesystem" in line]
    assert len(said) == 1 and "--out on another filesystem" in said[0], stderr
    assert f"{out}: " in said[0] and " MiB free" in said[0]


def test_a_disk_with_room_says_nothing_of_space(tmp_path: Path) -> None:
    proc = start_trace(["--out", str(tmp_path / "run"), "--no-lint", str(SINGLE_SCRIPT)], tmp_path)
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, (stdout, stderr)
    assert "free on its filesystem" not in stderr


@pytest.fixture
def no_free_inodes(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", "20m,nr_inodes=12")


def test_a_disk_without_free_files_is_refused_at_start(
    no_free_inodes: Path, tmp_path: Path
) -> None:
    """Issue 28 probe, class 8: free bytes and 12 inodes. Rank 1 could not create even
    its directory, lost its whole record and was said to be "started by another
    launcher"; rank 0 lost its steps and trace, and analyze found nothing. Now one line
    at start, exit 2, and the job is not started."""
    out = no_free_inodes / "run"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--standalone", "--no-lint",
         str(DDP_SCRIPT), "--steps", "5"],
        tmp_path,
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 2, (stdout, stderr)
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "not enough free files (inodes)" in lines[0], lines
    assert not out.exists() or not any(out.iterdir())


def test_full_disk_training_goes_on_and_run_is_incomplete(small_disk: Path, tmp_path: Path) -> None:
    out = small_disk / "run"
    times = tmp_path / "times.jsonl"  # on the big disk: the script's own record
    steps = 800
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--standalone", "--no-lint",
         "--profile-steps", "3-6", str(DDP_SCRIPT), "--steps", str(steps), "--width", "16",
         "--depth", "1", "--times", str(times)],
        tmp_path,
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S * 2)
    assert proc.returncode == 0, stderr[-3000:]
    # the training itself ran to the end on both ranks
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert all(r["steps"] == steps for r in rows)
    # gpudiag said so (once per process), and the run says why it is incomplete
    assert "No space left on device" in stderr
    assert "Traceback" not in stderr
    manifest = json.loads((out / rundir.MANIFEST).read_text())
    assert manifest["status"] == "ok" and manifest["exit_code"] == 0
    assert manifest["incomplete"] and any(
        "steps.jsonl: No space left on device" in r for r in manifest["incomplete"]
    )
    # no temporary or reserve files left, and the tables end on whole rows
    left = [p.name for p in out.rglob("*") if p.name.endswith(".tmp") or "reserve" in p.name]
    assert left == []
    run = rundir.load_run(out)
    assert not [w for w in run.warnings if "malformed" in w], run.warnings
    assert any("run incomplete" in w for w in run.warnings)
    counted = run.steps.groupby("rank").size()
    assert 0 < counted.max() < steps  # the table stopped when the disk filled
    analyzed = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert analyzed.returncode == 0, analyzed.stderr
    assert "run incomplete" in analyzed.stderr and "Traceback" not in analyzed.stderr


def test_sigterm_to_gpudiag_with_loader_workers_keeps_every_rank_andstart_trace(
    tmp_path: Path,
) -> None:
    """Issue 28 probe: SIGTERM to `gpudiag trace` on DDP with DataLoader workers. The
    workers die of the same signal and the DataLoader's SIGCHLD handler raised inside
    gpudiag's finish (a rank lost its status and trace) or in the rank (`failed`)."""
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--standalone", "--no-lint",
         "--profile-steps", "1-2", str(STRESS_SCRIPT), "--workers", "2", "--steps", "3000"],
        tmp_path,
    )  # fmt: skip
    wait_for_steps(out, 2, 6, proc, JOB_TIMEOUT_S)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 143, stderr[-3000:]
    manifest = json.loads((out / rundir.MANIFEST).read_text())
    assert manifest["status"] == "interrupted" and manifest["failure"] is None, manifest
    for rank in (0, 1):
        status = json.loads((rundir.rank_dir(out, rank) / rundir.STATUS).read_text())
        assert status["status"] == "interrupted", status
        assert rundir.trace_path(out, rank).is_file()
    assert "Traceback" not in stderr.split("gpudiag: run interrupted")[-1]


# --------------------------------------------------------------------------- launcher death


def test_sigkill_of_the_launcher_ends_the_ranks_and_reads_launcher_lost(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--standalone", "--no-lint",
         "--no-profile", str(DDP_SCRIPT), "--steps", "100000", "--sleep", "0.05"],
        tmp_path,
    )  # fmt: skip
    wait_for_steps(out, 2, 3, proc, JOB_TIMEOUT_S)
    pids = [json.loads((out / f"rank{r}" / rundir.RANK_INFO).read_text())["pid"] for r in (0, 1)]
    children = [
        int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    ]
    killed = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = killed + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids + children):
        time.sleep(0.1)
    gone_after = time.monotonic() - killed
    assert not any(_alive(p) for p in pids + children)
    assert gone_after < 15, gone_after
    run = rundir.load_run(out)
    assert run.manifest["status"] == "launcher_lost"
    analyzed = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "launcher_lost" in analyzed.stdout + analyzed.stderr


# --------------------------------------------------------------------------- two launches


def test_two_launches_at_once_never_share_a_directory(tmp_path: Path) -> None:
    script = SCRIPTS / "capture_single.py"
    args = ["--no-lint", "--no-profile", str(script), "--steps", "6"]
    procs = [start_trace(args, tmp_path) for _ in range(2)]
    shared = tmp_path / "shared_out"
    procs += [start_trace(["--out", str(shared), *args], tmp_path) for _ in range(2)]
    results = [(p.wait(timeout=JOB_TIMEOUT_S), *p.communicate()) for p in procs]
    # default --out: two directories, each with one run's rows
    assert [r[0] for r in results[:2]] == [0, 0], [r[2][-2000:] for r in results[:2]]
    runs = sorted((tmp_path / "gpudiag_runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert table_lines(rundir.table_path(rundir.rank_dir(run, 0), rundir.STEPS)) == 6
    # the same --out: one run owns it, the other is refused before starting anything
    codes = sorted(r[0] for r in results[2:])
    assert codes == [0, 2], [r[2][-2000:] for r in results[2:]]
    refused = next(r for r in results[2:] if r[0] == 2)
    assert "Traceback" not in refused[2]
    assert table_lines(rundir.table_path(rundir.rank_dir(shared, 0), rundir.STEPS)) == 6


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_to_a_two_rank_job_is_quick_and_quiet(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--nproc-per-node", "2", "--standalone", "--no-lint",
         "--no-profile", str(DDP_SCRIPT), "--steps", "100000", "--sleep", "0.02"],
        tmp_path,
    )  # fmt: skip
    wait_for_steps(out, 2, 5, proc, JOB_TIMEOUT_S)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert took < 20, took  # ~1 s on an idle machine (docs/reliability.md); loaded CI
    run = rundir.load_run(out)
    assert run.manifest["status"] == "interrupted"
    assert {s["status"] for s in run.statuses.values()} == {"interrupted"}
