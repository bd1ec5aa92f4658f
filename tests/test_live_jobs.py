"""`gpudiag watch` on real 2-rank gloo jobs while they run: the slow rank is named
lagging, the stuck collective and the rank that never arrived show before the hang
watchdog fires, and finished / failed runs get their state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Launches training processes: CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "live_job.py"
DEADLINE_S = 240  # a loaded 2-core machine starts torch slowly


def _start(run: Path, mode: str, stop: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2", "--standalone",
        "--no-lint", "--no-profile", "--hang-timeout", "600", "--out", str(run),
        str(SCRIPT), mode, str(stop),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _watch(run: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(run), "--once", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _watch_until(run: Path, job: subprocess.Popen, done, *extra: str) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    snap: dict = {}
    while time.monotonic() < deadline:
        if not run.is_dir() or job.poll() is not None:
            if job.poll() is not None:
                break
            time.sleep(0.5)
            continue
        snap = _watch(run, *extra)
        if done(snap):
            return snap
        time.sleep(1.0)
    _end(job)
    pytest.fail(f"watch never saw it; last snapshot {snap}; job output {_output(job)}")


def _end(job: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if job.poll() is None:
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            pass
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)


def _output(job: subprocess.Popen) -> str:
    try:
        out, _ = job.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        return ""
    return (out or "")[-2000:]


def test_slow_rank_named_while_running_then_finished(tmp_path: Path) -> None:
    run, stop = tmp_path / "run", tmp_path / "stop"
    job = _start(run, "slow", stop)
    try:
        snap = _watch_until(run, job, lambda s: s["lagging"])
        assert snap["state"] == "running"
        assert snap["lagging"] == [1]
        by_rank = {r["rank"]: r for r in snap["ranks"]}
        assert set(by_rank) == {0, 1}
        for r in by_rank.values():
            assert r["step"] is not None and r["step"] >= 1
            assert r["steps_per_s"] > 0 and r["median_step_ms"] > 0
            assert r["since_last_step_s"] >= 0
        assert snap["stuck"] == []
    finally:
        stop.write_text("stop")
        job.wait(timeout=DEADLINE_S)
    assert job.returncode == 0, _output(job)
    done = _watch(run)
    assert done["state"] == "ok"
    assert done["failed_ranks"] == []
    assert {r["status"] for r in done["ranks"]} == {"ok"}


def test_stuck_collective_and_missing_rank_before_the_watchdog(tmp_path: Path) -> None:
    run, stop = tmp_path / "run", tmp_path / "stop"
    job = _start(run, "stuck", stop)
    try:
        snap = _watch_until(run, job, lambda s: s["stuck"], "--stuck-after", "3")
        assert snap["state"] == "running"  # the watchdog (600 s) has not fired
        assert not (run / "hang_report.json").exists()
        stuck = snap["stuck"][0]
        assert stuck["op"] == "all_reduce"
        assert stuck["arrived"] == [0]
        assert stuck["missing"] == [1]
        assert stuck["waiting_s"] >= 3
        assert isinstance(stuck["seq"], int) and stuck["pg"] is not None
        by_rank = {r["rank"]: r for r in snap["ranks"]}
        assert by_rank[0]["step"] == by_rank[1]["step"] == 4  # both stopped after step 4
    finally:
        _end(job, signal.SIGTERM)


def test_stuck_ddp_bucket_all_reduce_from_the_flight_recorder(tmp_path: Path) -> None:
    """DDP's default bucket all-reduce is C++: no wrapper sees it enter. A rank idle for
    5 s dumps its Flight Recorder from the poll thread; the watch matches the ranks'
    frontiers and names the rank that never issued the collective."""
    run, stop = tmp_path / "run", tmp_path / "stop"
    job = _start(run, "ddp", stop)
    try:
        snap = _watch_until(run, job, lambda s: s["stuck"], "--stuck-after", "3")
        assert snap["state"] == "running"
        assert not (run / "hang_report.json").exists()
        (stuck,) = snap["stuck"]
        assert stuck["op"] == "all_reduce"
        assert stuck["arrived"] == [0]
        assert stuck["missing"] == [1]
        assert stuck["waiting_s"] >= 3
    finally:
        _end(job, signal.SIGTERM)


def test_failed_run_names_the_rank(tmp_path: Path) -> None:
    run, stop = tmp_path / "run", tmp_path / "stop"
    job = _start(run, "fail", stop)
    job.wait(timeout=DEADLINE_S)
    assert job.returncode != 0
    snap = _watch(run)
    assert snap["state"] == "failed"
    assert snap["failed_ranks"][0] == 1
    assert snap["stuck"] == []
