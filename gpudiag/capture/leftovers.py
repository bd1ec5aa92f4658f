"""Processes a finished job left behind, found and ended by the launcher.

A rank's forked child can outlive it: a DataLoader worker that deadlocked in
``os.fork`` (CPython gh-112275) never runs a line of Python, so it neither notices its
parent is gone nor acts on SIGTERM (it inherited the rank's Python-level handler, which
only sets a flag). torchrun SIGKILLs a rank's process group only while the rank itself
runs, so such a child stayed, orphaned, after ``gpudiag trace`` returned. The launcher
ends them as a batch scheduler ends a job step: whatever is still running in the job's
sessions (the job's own, and each rank's under torchrun) once the job has ended gets
SIGTERM, then SIGKILL after a grace period, unless it ends by itself within a few
seconds (multiprocessing's resource tracker, DataLoader workers that notice their rank is
gone). A process that started a session of its own (a deliberate daemon:
``start_new_session=True``, ``setsid``) is not the job's and stays.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LEFTOVER_GRACE_S = 3.0
# what the job left gets this long to end by itself first: multiprocessing's resource
# tracker exits once the job's last process has, after its clean-up (SIGTERM is ignored
# there and SIGKILL would leave the job's semaphores and shared memory behind: probe 28i)
SELF_EXIT_S = 5.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Leftover:
    pid: int
    name: str


def _stat_fields(pid: int) -> tuple[str, list[bytes]] | None:
    """(command name, the fields after it) of /proc/<pid>/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    head, _, rest = raw.rpartition(b")")
    return head.partition(b"(")[2].decode(errors="replace"), rest.split()


def _running(fields: list[bytes]) -> bool:
    return bool(fields) and fields[0] not in (b"Z", b"X")


def _start_ticks(fields: list[bytes]) -> int:
    """The process's start time (clock ticks since boot: stat field 22)."""
    return int(fields[19]) if len(fields) > 19 else 0


def find_leftovers(sessions: Iterable[int], exclude: Iterable[int] = ()) -> list[Leftover]:
    """Live processes (not zombies) whose session is one of ``sessions``, started after
    this process (a session id is a pid, and a pid can be reused), except ``exclude`` and
    this process: one read of each /proc/<pid>/stat."""
    wanted = {str(s).encode() for s in sessions if s > 0}
    skip = {os.getpid(), *exclude}
    own = _stat_fields(os.getpid())
    not_before = _start_ticks(own[1]) if own else 0
    found: list[Leftover] = []
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        stat = _stat_fields(int(entry))
        # fields after the name: state ppid pgrp session ...
        if stat is None or len(stat[1]) < 4 or stat[1][3] not in wanted:
            continue
        if _running(stat[1]) and _start_ticks(stat[1]) >= not_before:
            found.append(Leftover(int(entry), stat[0]))
    return found


def _alive(pid: int) -> bool:
    stat = _stat_fields(pid)
    return stat is not None and _running(stat[1])


def send(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def end_leftovers(leftovers: list[Leftover], grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGTERM each, SIGKILL those still running after ``grace_s``; the pids that needed
    SIGKILL."""
    pids = [p.pid for p in leftovers]
    send(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return []
        time.sleep(_POLL_S)
    pids = [p for p in pids if _alive(p)]
    send(pids, signal.SIGKILL)
    return pids


def sweep(sessions: Iterable[int], say: Callable[[str], None]) -> None:
    """End what the job left running in ``sessions``, saying so; never raises (the job's
    outcome is already recorded)."""
    try:
        left = _still_running(find_leftovers(sessions), SELF_EXIT_S)
        if left:
            say(describe(left, end_leftovers(left)))
    except OSError:
        pass


def _still_running(leftovers: list[Leftover], wait_s: float) -> list[Leftover]:
    """Those of ``leftovers`` that have not ended by themselves within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while leftovers and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        leftovers = [p for p in leftovers if _alive(p.pid)]
    return leftovers


def describe(leftovers: list[Leftover], killed: list[int]) -> str:
    """One line for the launcher's output."""
    named = ", ".join(f"{p.pid} ({p.name})" for p in leftovers[:5])
    more = f" and {len(leftovers) - 5} more" if len(leftovers) > 5 else ""
    how = (
        f"SIGTERM, then SIGKILL for {len(killed)} still running after {LEFTOVER_GRACE_S:g} s"
        if killed
        else "SIGTERM"
    )
    return (
        f"the job left {len(leftovers)} process{'es' if len(leftovers) > 1 else ''} "
        f"running after it ended: {named}{more}; ended with {how}"
    )
