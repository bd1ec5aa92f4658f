"""SIGTERM to `gpudiag trace` while its watchdog suspects a hang it leaves running
(``--on-hang report``; ``auto`` with a rank idle outside a collective): the user's (or
the scheduler's) SIGTERM ended the job, not the watchdog. Each rank said "ended by
gpudiag's hang watchdog: ... (then: SIGTERM from the agent)" with the hang exit code,
and an mp.spawn job exited 1 where plain python exits 143 (probe 28j, F5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag import rundir

SCRIPT = Path(__file__).parent / "scripts" / "spawn_suspected_hang.py"
PORT = "42017"


@pytest.mark.slow
def test_sigterm_while_a_hang_is_only_suspected_is_the_users_interrupt(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint",
         "--no-profile", "--hang-timeout", "2", "--on-hang", "report", str(SCRIPT), PORT],
        cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    report = rundir.hang_report_path(run, 0)
    deadline = time.monotonic() + 240
    while not report.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the watchdog's report: the hang is suspected now
    assert report.exists(), proc.communicate(timeout=60)
    assert json.loads(report.read_text())["ended"] is False
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    err = err[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM, err  # plain python: 143
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", err
    assert not manifest["failed_ranks"], manifest["failure"]
    for rank in (0, 1):
        status = json.loads((rundir.rank_dir(run, rank) / rundir.STATUS).read_text())
        assert status["status"] == "interrupted", status
        assert "watchdog" not in (status["message"] or ""), status
