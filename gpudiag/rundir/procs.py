"""Process liveness: whether a run's launcher is still alive (and the same process),
and the run status readers report from it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from gpudiag.rundir.schema import _is_num

# The launcher touches its manifest every LAUNCHER_HEARTBEAT_S while the job runs.
# A reader on another host (where the pid cannot be checked) takes a manifest that still
# says running and has not been touched for LAUNCHER_STALE_S as a lost launcher.
LAUNCHER_HEARTBEAT_S = 5.0
LAUNCHER_STALE_S = 60.0


def _process_start_time(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # psutil missing, no such process, access denied
        return None


def process_start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since the host booted (field 22 of
    ``/proc/<pid>/stat``): fixed for the process's life, whatever the wall clock does.
    None where it cannot be read (no such process, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This boot of the host (a process's start ticks count from it), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


def _ticks_of(launcher: dict[str, Any]) -> int | None:
    ticks = launcher.get("start_ticks")
    return ticks if type(ticks) is int and ticks >= 0 else None


def launcher_gone(manifest: dict[str, Any], manifest_file: str | os.PathLike[str]) -> str | None:
    """Why the launcher of a run still marked running is known to be gone, or None
    (alive, or nothing to tell). Same host: its pid no longer exists, or belongs to a
    process started at another moment (the start ticks since boot the launcher recorded,
    which no change of the wall clock moves; an older launcher's record has only its
    start in epoch seconds), or the host restarted since. Another host: the manifest
    heartbeat is stale."""
    launcher = manifest.get("launcher")
    if launcher is None:
        return None  # no record of the launcher (written before it was recorded)
    bad = launcher_pid_problem(launcher)
    if bad:  # a record no launcher writes: nothing can show it alive, so it is not
        return f"{bad}; taken as not running"
    assert isinstance(launcher, dict)
    pid = launcher["pid"]
    host = launcher.get("hostname")
    if host == socket.gethostname():
        ticks = _ticks_of(launcher)
        if ticks is not None:
            return _launcher_gone_here(launcher, pid, ticks)
        started = launcher.get("start_time")
        actual = _process_start_time(pid)
        if actual is None and not pid_exists(pid):
            return f"launcher pid {pid} on {host} is gone"
        if actual is not None and isinstance(started, (int, float)) and abs(actual - started) > 2:
            return f"launcher pid {pid} on {host} is gone (the pid now belongs to another process)"
        return None
    beat = launcher.get("heartbeat_s")  # a period over LAUNCHER_STALE_S (1e300) is not believed
    period = min(float(beat), LAUNCHER_STALE_S) if isinstance(beat, (int, float)) else 0.0
    period = period if _is_num(beat) and period > 0 else 0.0
    stale = max(LAUNCHER_STALE_S, 10 * period)
    try:
        age = time.time() - os.stat(manifest_file).st_mtime
    except OSError:
        return None
    if age > stale:
        return f"launcher on {host or 'another host'} has not touched the manifest for {age:.0f} s"
    return None


def _launcher_gone_here(launcher: dict[str, Any], pid: int, ticks: int) -> str | None:
    """A launcher on this host that recorded its start ticks. Its start in epoch seconds
    (psutil's create_time: the ticks plus the boot time the kernel derives from the wall
    clock) moves when the wall clock is stepped: a VM paused and resumed had its clock set
    15 s on, and `gpudiag watch` said `launcher_lost` of a live launcher (issue 28, NEW-2)."""
    host = launcher.get("hostname")
    recorded_boot = launcher.get("boot_id")
    current_boot = boot_id()
    if isinstance(recorded_boot, str) and current_boot and recorded_boot != current_boot:
        return f"launcher pid {pid} on {host} is gone (the host restarted since)"
    actual = process_start_ticks(pid)
    if actual is None:
        return None if pid_exists(pid) else f"launcher pid {pid} on {host} is gone"
    if actual != ticks:
        return f"launcher pid {pid} on {host} is gone (the pid now belongs to another process)"
    return None


def launcher_pid_problem(launcher: object) -> str | None:
    """What is wrong with a manifest's launcher record, or None. Every launcher writes its
    pid, an int the kernel gives (1.._MAX_PID): a string ("123"), a float (1e300), a bool,
    a missing pid or a record that is not an object cannot be a running launcher."""
    if not isinstance(launcher, dict):
        return f"launcher record {_short_repr(launcher)} is not an object"
    if "pid" not in launcher:
        return "launcher record has no pid"
    pid = launcher["pid"]
    if type(pid) is int and 0 < pid <= _MAX_PID:
        return None
    return f"launcher pid {_short_repr(pid)} is not a process id (an integer 1..{_MAX_PID})"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def pid_exists(pid: int) -> bool:
    if pid <= 0 or pid > _MAX_PID:  # a pid no kernel gives (a bad manifest): not running
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


_MAX_PID = 2**22  # Linux's pid_max limit (PID_MAX_LIMIT)


def run_status(manifest: dict[str, Any], manifest_file: str | os.PathLike[str]) -> str | None:
    """The run's status as a reader should see it: the manifest's, except that a run
    still marked running whose launcher is gone is ``launcher_lost``."""
    status = manifest.get("status")
    if status == "running" and launcher_gone(manifest, manifest_file):
        return "launcher_lost"
    return status if isinstance(status, str) else None


def _reader_notes(manifest: dict[str, Any], manifest_file: Path, warnings: list[str]) -> None:
    """Adjust the manifest to what a reader should see (launcher_lost) and warn about
    runs whose record is incomplete."""
    if manifest.get("status") == "running":
        why = launcher_gone(manifest, manifest_file)
        if why:
            manifest["recorded_status"] = "running"
            manifest["status"] = "launcher_lost"
            warnings.append(
                f"{manifest_file}: launcher_lost: the run never finished ({why}); its "
                "tables hold what the ranks wrote before"
            )
    incomplete = manifest.get("incomplete")
    if isinstance(incomplete, list) and incomplete:
        shown = "; ".join(str(x) for x in incomplete[:3])
        more = f" (+{len(incomplete) - 3} more)" if len(incomplete) > 3 else ""
        warnings.append(f"{manifest_file}: run incomplete: {shown}{more}")
