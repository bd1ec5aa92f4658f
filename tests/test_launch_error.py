"""A torchrun usage error before any rank started (an unknown ``--rdzv-backend``): the
launch failed, no rank did. Before, the manifest said ``failed_ranks [0, 1]`` and the
report "rank_failed ... ranks 0 and 1" with the fix "read the traceback of the first
failing rank" (probe 28j, F6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_a_torchrun_usage_error_is_a_launch_error_with_no_rank_blamed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint",
         "--no-profile", "--nproc-per-node", "2", "--rdzv-backend", "no-such-backend",
         str(script)],
        cwd=tmp_path, env=dict(os.environ, MASTER_PORT="42031"), capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    err = proc.stderr[-3000:]
    assert proc.returncode == 1, err
    assert "trained" not in proc.stdout
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed", err
    assert manifest["failed_ranks"] == [], manifest
    assert manifest["failure"]["rank"] is None and manifest["failure"]["exc_type"] == "launch_error"
    analysed = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", "--json", str(run)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    findings = json.loads(analysed.stdout)["findings"]
    (failure,) = [f for f in findings if f["kind"] == "rank_failed"]
    assert failure["ranks"] == [], failure
    assert failure["title"].startswith("The job failed to launch (no rank started)"), failure
    assert failure["evidence"]["failed_ranks"] == [], failure
    assert "no rank of the script is at fault" in failure["fix"]
    terminal = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run)],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"),
    )  # fmt: skip
    header = next(line for line in terminal.stdout.splitlines() if "rank_failed" in line)
    # the launch failed, no rank: not "all ranks" (every view words it the same way)
    assert "no rank" in header and "all ranks" not in header, header
    assert "all ranks" not in terminal.stdout, terminal.stdout[-2000:]
