"""Ctrl-C to a job whose ranks the script starts itself (mp.spawn): a terminal sends SIGINT
to every process of its foreground group, so each worker runs its own clean-up. gpudiag
starts the job in a session of its own and forwarded the signal to the job's top process
only: the workers never saw it, and were SIGKILLed 30 s later with no checkpoint and no
status (probe 28g, N1, 3 of 3). The signal now goes to the job's process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "spawn_ctrl_c.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_ctrl_c_reaches_the_workers_mp_spawn_started(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", str(SCRIPT), str(_free_port())]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the terminal's foreground group: gpudiag alone
    )
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"started.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        sent = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (tmp_path / "ckpt.0").is_file() and (tmp_path / "ckpt.1").is_file(), err[-3000:]
    assert "rank 0 saved" in out and "rank 1 saved" in out
    assert took < 25, (took, err[-3000:])  # not the 30 s grace and its SIGKILL
    assert "wrote no status" not in err, err[-3000:]
