"""`gpudiag watch` on real 2-rank gloo jobs while they run: the slow rank is named
lagging, the stuck collective and the rank that never arrived show before the hang
watchdog fires, and finished / failed runs get their state."""

from __future__ import annotations

import json
import os
import signal
import statistics
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


def test_the_lagging_window_follows_the_newest_step_of_a_ddp_job(tmp_path: Path) -> None:
    """Probe 31k, D7: the live lagging window trailed the newest step by 22-155 steps
    (median 93, ~6 s) on a 15-steps/s DDP job: its collectives (DDP's C++ bucket
    all-reduces: only the Flight Recorder sees them) reached the run directory when the
    ring of 2000 was dumped, at most every 400 times the last dump's (wall) duration,
    ~30 ms a full ring: every 10 s. A ring of 512, dumped as a pickle, its age set by the
    dump's own CPU time: every 1-2 s. Here a DDP job of 16 buckets a step (the ring of
    2000 full after ~120 steps), rank 1 30 ms late at each: followed with the dashboard's
    LiveMonitor for its last ~15 s, the window trails the newest step by at most ~2 s
    (median), and rank 1 is named lagging at every refresh once a window exists."""
    from gpudiag.analysis.live_snapshot import LiveMonitor

    run = tmp_path / "run"
    job = _start_steps(run, "ddpslow", 900)
    samples: list[tuple[float, list[int]]] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (run / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        monitor = LiveMonitor(run)
        started = None
        while job.poll() is None and time.monotonic() < deadline:
            snap = monitor.refresh().snapshot
            steps = [r.step for r in snap.ranks if r.step is not None]
            medians = [r.median_step_ms for r in snap.ranks if r.median_step_ms]
            if snap.lagging_window and steps and medians and min(steps) >= 300:
                started = started or time.monotonic()
                behind = max(steps) - snap.lagging_window[1]
                samples.append((behind * statistics.median(medians) / 1000, snap.lagging))
            time.sleep(0.5)
        assert job.wait(timeout=DEADLINE_S) == 0, _output(job)
    finally:
        _end(job)
    assert len(samples) >= 10, samples
    lags = sorted(s for s, _ in samples)
    assert statistics.median(lags) <= 2.5, lags
    assert all(named == [1] for _, named in samples), samples


def _start_steps(run: Path, mode: str, steps: int) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2", "--standalone",
        "--no-lint", "--no-profile", "--hang-timeout", "600", "--out", str(run),
        str(SCRIPT), mode, str(run.parent / "never"), str(steps),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
