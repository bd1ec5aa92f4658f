"""Issue 28 probe: a launcher record no launcher writes never makes a run look alive
(docs/reliability.md). Fast: a manifest file judged by rundir's readers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
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


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here (not through gpudiag)."""
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])


def _launcher_identity_of(pid: int) -> dict:
    """The launcher record this code's launcher writes (capture.manifest), for ``pid``."""
    import psutil

    return {
        "pid": pid,
        "hostname": socket.gethostname(),
        "start_time": float(psutil.Process(pid).create_time()),
        "start_ticks": _start_ticks(pid),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "heartbeat_s": rundir.LAUNCHER_HEARTBEAT_S,
    }


def test_a_live_launcher_is_running_after_the_wall_clock_moved(tmp_path: Path) -> None:
    """Issue 28, NEW-2: `gpudiag watch --once --json` said `launcher_lost` twice of a
    live launcher on a loaded VM. The host's wall clock had been stepped ~15 s on (a
    rank's 45 s sleep spanned 61 s of wall time, the sampler's rows a 14.9 s gap), and a
    process's start in epoch seconds (psutil's create_time: its ticks since boot plus the
    boot time the kernel derives from the wall clock) moved with it: the reader compared
    it with the launcher's recorded start_time, 2 s apart at most. The launcher now also
    records its start ticks and the boot's id, which no clock change moves; a stale
    heartbeat is not read on the launcher's own host. Recreated here: the recorded
    start_time is what psutil gave before the step."""
    here = _launcher_identity_of(os.getpid())
    for step in (15.0, -15.0, 3600.0):
        launcher = dict(here, start_time=here["start_time"] - step)
        manifest, path = _write(tmp_path, launcher, age_s=600)  # a frozen VM's heartbeat
        assert rundir.launcher_gone(manifest, path) is None, step
        assert rundir.run_status(manifest, path) == "running"
        batch = rundir.LiveReader(tmp_path).poll()
        assert batch.status == "running" and batch.warnings == [], (step, batch.warnings)
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(tmp_path), "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["state"] == "running", done.stdout[-3000:]
    from gpudiag.capture.manifest import launcher_identity

    written = launcher_identity(rundir.LAUNCHER_HEARTBEAT_S)
    assert (written.get("start_ticks"), written.get("boot_id")) == (
        here["start_ticks"],
        here["boot_id"],
    )


def test_a_launcher_that_is_gone_is_still_lost_by_its_start_ticks(tmp_path: Path) -> None:
    """What the start ticks must still tell: a pid now another process's (other start
    ticks), a host restarted since (another boot id), a launcher that exited."""
    here = _launcher_identity_of(os.getpid())
    manifest, path = _write(tmp_path, dict(here, start_ticks=here["start_ticks"] - 1))
    why = rundir.launcher_gone(manifest, path)
    assert why and "belongs to another process" in why, why
    manifest, path = _write(tmp_path, dict(here, boot_id="another-boot"))
    why = rundir.launcher_gone(manifest, path)
    assert why and "the host restarted since" in why, why
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher = dict(here, pid=child.pid, start_ticks=_start_ticks(child.pid))
    child.wait()
    manifest, path = _write(tmp_path, launcher)
    why = rundir.launcher_gone(manifest, path)
    assert why and "is gone" in why and rundir.run_status(manifest, path) == "launcher_lost", why
