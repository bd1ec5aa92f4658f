"""Helpers for the tests that run `gpudiag trace` jobs: wait for their steps, mount a
small tmpfs for a disk that fills up."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudiag import rundir


def table_lines(path: Path) -> int:
    """Non-empty lines of a table written so far (0 when it cannot be read yet)."""
    try:
        return sum(1 for line in path.read_bytes().splitlines() if line.strip())
    except OSError:
        return 0


def wait_for_steps(
    out: Path, ranks: int, steps: int, proc: subprocess.Popen, timeout_s: float
) -> None:
    """Until every rank of ``out`` has recorded ``steps`` steps (the job still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        table = (rundir.table_path(rundir.rank_dir(out, r), rundir.STEPS) for r in range(ranks))
        if min(table_lines(p) for p in table) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {steps} steps in {out}: {proc.poll()=}")


def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``mount`` (created), unmounted after; skips the test where
    mounting is not allowed."""
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def start_trace(
    args: list[str], cwd: Path, fsize: int | None = None, sigint_ignored: bool = False
) -> subprocess.Popen:
    """`gpudiag trace ARGS` started in ``cwd`` (text pipes), under a file size limit of
    ``fsize`` bytes (RLIMIT_FSIZE, as `ulimit -f`) when given, with SIGINT ignored (as a
    shell script's background job) when ``sigint_ignored``."""

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if sigint_ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "gpudiag", "trace", *args],
        cwd=cwd,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit if fsize is not None or sigint_ignored else None,
    )


def run_each_rank(commands: list[list[str]], env: dict[str, str], timeout_s: float) -> None:
    """Each rank's command started at once (ranks launched separately), all waited for."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in commands
    ]
    for proc in procs:
        proc.communicate(timeout=timeout_s)
