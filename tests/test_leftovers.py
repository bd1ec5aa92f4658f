"""Processes a finished job leaves running are ended by the launcher (issue 28: a
DataLoader worker deadlocked in os.fork stayed, orphaned, after the job ended); a process
that started its own session is not the job's and stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.capture import leftovers

SCRIPT = Path(__file__).parent / "scripts" / "leaves_children.py"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _child_pid(folder: Path, rank: int) -> int:
    return int((folder / f"child{rank}.pid").read_text())


def _run_script_as_session(mode: str, folder: Path) -> int:
    """The script as the leader of a session of its own (as the launcher starts a job);
    returns that session's id once the script has ended."""
    env = {**os.environ, "LEFTOVER_DIR": str(folder)}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), mode], env=env, start_new_session=True)
    assert proc.wait(timeout=120) == 0
    return proc.pid


def test_a_child_that_ignores_sigterm_is_found_and_killed(tmp_path: Path) -> None:
    session = _run_script_as_session("stuck", tmp_path)
    child = _child_pid(tmp_path, 0)
    try:
        found = leftovers.find_leftovers({session})
        assert [p.pid for p in found] == [child]
        killed = leftovers.end_leftovers(found, grace_s=0.5)
        assert killed == [child]  # SIGTERM was ignored
        assert _gone_within(child, 10)
        assert "SIGKILL" in leftovers.describe(found, killed)
    finally:
        os.kill(child, signal.SIGKILL) if _running(child) else None


def test_a_process_that_ends_by_itself_is_neither_signalled_nor_reported(tmp_path: Path) -> None:
    """multiprocessing's resource tracker outlives an interrupted mp.spawn job by a moment
    (its clean-up) and ignores SIGTERM: the sweep killed it and said so (probe 28i, M1)."""
    session = _run_script_as_session("late", tmp_path)
    child = _child_pid(tmp_path, 0)
    said: list[str] = []
    try:
        leftovers.sweep({session}, said.append)
        assert said == []
        assert (tmp_path / "child0.ended").exists()  # it ran to its end, not killed
    finally:
        os.kill(child, signal.SIGKILL) if _running(child) else None


def test_a_child_in_a_session_of_its_own_is_not_the_jobs(tmp_path: Path) -> None:
    session = _run_script_as_session("daemon", tmp_path)
    child = _child_pid(tmp_path, 0)
    try:
        assert leftovers.find_leftovers({session}) == []
    finally:
        os.kill(child, signal.SIGKILL)


def _trace(out: Path, folder: Path, mode: str, ranks: int) -> subprocess.CompletedProcess:
    torchrun = ["--nproc-per-node", str(ranks)] if ranks > 1 else []
    env = {**os.environ, "LEFTOVER_DIR": str(folder), "LEFTOVER_RANK": str(ranks - 1)}
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
         "--no-profile", *torchrun, str(SCRIPT), mode],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_gpudiag_trace_leaves_no_process_of_the_job_running(tmp_path: Path, ranks: int) -> None:
    """One process, and rank 1 under the torchrun-style launcher (each rank its own
    session): the child that outlived its rank is ended before `gpudiag trace` returns,
    the run is still ok, and the launcher says what it ended."""
    traced = _trace(tmp_path / "run", tmp_path, "stuck", ranks)
    child = _child_pid(tmp_path, ranks - 1)
    try:
        assert traced.returncode == 0, traced.stderr[-3000:]
        assert _gone_within(child, 2), "the job's leftover child still runs"
        assert f"left 1 process running after it ended: {child}" in traced.stderr
    finally:
        os.kill(child, signal.SIGKILL) if _running(child) else None


@pytest.mark.slow
def test_gpudiag_trace_leaves_a_daemon_alone(tmp_path: Path) -> None:
    traced = _trace(tmp_path / "run", tmp_path, "daemon", 1)
    child = _child_pid(tmp_path, 0)
    try:
        assert traced.returncode == 0, traced.stderr[-3000:]
        assert _running(child)
        assert "running after it ended" not in traced.stderr
    finally:
        os.kill(child, signal.SIGKILL)
