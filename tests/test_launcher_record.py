"""Issue 28 probe: a launcher record no launcher writes never makes a run look alive
(docs/reliability.md). Fast: a manifest file judged by rundir's readers."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from gpudiag import rundir


def _write(tmp_path: Path, launcher: object, age_s: float = 0.0) -> tuple[dict, Path]:
    manifest = {"format_version": 1, "status": "running", "launcher": launcher}
    path = tmp_path / rundir.MANIFEST
    path.write_text(json.dumps(manifest))
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return manifest, path


@pytest.mark.parametrize(
    "pid", ["1234", 1e300, 12.0, 2**70, 2**22 + 1, 0, -5, True, [1], {"pid": 1}]
)
def test_a_pid_that_is_no_process_id_is_not_running(tmp_path: Path, pid: object) -> None:
    manifest, path = _write(tmp_path, {"pid": pid, "hostname": socket.gethostname()})
    why = rundir.launcher_gone(manifest, path)
    assert why and "is not a process id" in why and "not running" in why, why
    assert rundir.run_status(manifest, path) == "launcher_lost"
    batch = rundir.LiveReader(tmp_path).poll()
    assert batch.status == "launcher_lost" and not batch.writing
    (line,) = batch.warnings
    assert line.startswith(f"{path}: launcher pid ") and "taken as not running" in line


def test_a_record_without_pid_or_not_an_object_is_not_running(tmp_path: Path) -> None:
    for launcher in ({"hostname": socket.gethostname()}, "launcher", 7):
        manifest, path = _write(tmp_path, launcher)
        assert rundir.run_status(manifest, path) == "launcher_lost", launcher
        (line,) = rundir.LiveReader(tmp_path).poll().warnings
        assert line.startswith(f"{path}: launcher record "), line


def test_a_live_launcher_and_an_old_run_without_a_record_are_as_before(tmp_path: Path) -> None:
    manifest, path = _write(tmp_path, {"pid": os.getpid(), "hostname": socket.gethostname()})
    assert rundir.run_status(manifest, path) == "running"
    assert rundir.LiveReader(tmp_path).poll().warnings == []
    manifest, path = _write(tmp_path, None)
    manifest.pop("launcher")
    assert rundir.run_status(manifest, path) == "running"  # nothing to judge it by


def test_a_huge_heartbeat_period_does_not_keep_another_hosts_run_alive(tmp_path: Path) -> None:
    """Another host's launcher is judged by the manifest's age; a heartbeat_s of 1e300
    made the limit 1e301 s, so the run looked live forever."""
    launcher = {"pid": 1234, "hostname": "another-host.invalid", "heartbeat_s": 1e300}
    manifest, path = _write(
        tmp_path, launcher, age_s=11 * 10 * rundir.LAUNCHER_STALE_S
    )  # past any believed limit
    assert rundir.run_status(manifest, path) == "launcher_lost"
    manifest, path = _write(tmp_path, dict(launcher, heartbeat_s=5.0))
    assert rundir.run_status(manifest, path) == "running"  # fresh: alive
