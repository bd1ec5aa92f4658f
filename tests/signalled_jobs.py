"""Helpers for the tests that signal a `gpudiag trace` job of
tests/scripts/launcher_signal_job.py (one process, mp.spawn, torchrun-style) and its
processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "launcher_signal_job.py"
RANKS = {"single": (0,), "spawn": (0, 1), "torchrun": (0, 1)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_signals() -> None:
    """The launcher starts as from a login shell: every signal at its default (a CI
    runner or this tool's shell may hand SIGQUIT down ignored, which the job inherits)."""
    for signum in range(1, signal.NSIG):
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def wait_for(proc: subprocess.Popen, paths: list[Path]) -> None:
    """Until every path exists (no timing margin: the files say what happened)."""
    deadline = time.monotonic() + 240
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"never saw {paths} (exit {proc.returncode}):\n{out}\n{err[-3000:]}")
        time.sleep(0.2)


def start_job(
    tmp_path: Path,
    mode: str,
    handled: list[str],
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen:
    port = str(free_port())
    launch = ["--nproc-per-node", "2", "--master-port", port]
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", *(launch if mode == "torchrun" else []),
               str(SCRIPT), mode, port, *handled]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=preexec or default_signals, env={**os.environ, **(env or {})},
    )  # fmt: skip
    wait_for(proc, [tmp_path / f"ready.{r}" for r in RANKS[mode]])
    return proc
