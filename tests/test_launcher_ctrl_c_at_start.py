"""Ctrl-C to `gpudiag trace` while it starts, before the job runs (hB's probe of issue 28:
a KeyboardInterrupt traceback out of gpudiag's launcher). A real SIGINT is raised in the
launcher at a named function of its start-up (tests/scripts/interrupt_in_launcher), so
there is no timing margin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = Path(__file__).parent / "scripts" / "interrupt_in_launcher"
JOB = "import time\nfor _ in range(600):\n    time.sleep(0.05)\nprint('trained')\n"


def _trace(tmp_path: Path, at: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["GPUDIAG_TEST_LAUNCHER_SIGINT_AT"] = at
    run = tmp_path / "run"
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint",
               "--no-profile", str(script)]  # fmt: skip
    proc = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, run


def test_ctrl_c_before_the_run_directory_is_claimed_is_one_line_and_python_exit(
    tmp_path: Path,
) -> None:
    """Interrupted while the command line is read: one line, no traceback, and the
    launcher dies of SIGINT as a python program interrupted there does; no run directory."""
    proc, run = _trace(tmp_path, "gpudiag.cli.trace:parse")
    assert "test: SIGINT at gpudiag.cli.trace:parse" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "gpudiag trace: interrupted (Ctrl-C)" in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr[-3000:])
    assert not run.exists()


@pytest.mark.parametrize(
    "at", ["gpudiag.capture.launcher:_first_manifest", "gpudiag.capture.run_claim:_open_dir"]
)
def test_ctrl_c_while_the_run_directory_is_claimed_ends_the_run_interrupted(
    tmp_path: Path, at: str
) -> None:
    """Interrupted while the run directory is made and its first manifest written: the
    run ends `interrupted` with its manifest (before: a KeyboardInterrupt traceback, the
    manifest left `running`)."""
    proc, run = _trace(tmp_path, at)
    err = proc.stderr[-3000:]
    assert f"test: SIGINT at {at}" in proc.stderr, err  # interrupted where meant
    assert "Traceback" not in proc.stderr, err
    assert "trained" not in proc.stdout, err  # the job did not run to its end
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", err
    assert not manifest.get("failed_ranks"), (manifest.get("failure"), err)
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
