"""SIGUSR1 / SIGUSR2 to `gpudiag trace` (probe 28i, F3): under plain python the script's
handler runs and training goes on (SLURM ``--signal=USR1@N``, Lightning's requeue); the
launcher died of the default action, the job with it, its manifest left ``running``.
Now each reaches every rank that handles it, the launcher lives, the run ends ``ok``.
Real jobs: one process, 2 mp.spawn gloo ranks, 2 torchrun-style gloo ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "user_signal_job.py"
PORTS = {"single": 29461, "spawn": 29462, "torchrun": 29463}
RANKS = {"single": (0,), "spawn": (0, 1), "torchrun": (0, 1)}


def _wait_for(proc: subprocess.Popen, paths: list[Path]) -> None:
    """Until every path exists (no timing margin: the files say what happened)."""
    deadline = time.monotonic() + 240
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"never saw {paths} (exit {proc.returncode}):\n{out}\n{err[-3000:]}")
        time.sleep(0.2)


def _start(tmp_path: Path, mode: str) -> subprocess.Popen:
    launch = ["--nproc-per-node", "2", "--master-port", str(PORTS[mode])]
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", *(launch if mode == "torchrun" else []),
               str(SCRIPT), mode, str(PORTS[mode])]  # fmt: skip
    return subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "spawn", "torchrun"])
def test_sigusr_to_the_launcher_reaches_the_ranks_handlers_and_the_job_goes_on(
    tmp_path: Path, mode: str
) -> None:
    ranks = RANKS[mode]
    proc = _start(tmp_path, mode)
    try:
        _wait_for(proc, [tmp_path / f"ready.{r}" for r in ranks])
        for name in ("SIGUSR1", "SIGUSR2"):
            os.kill(proc.pid, getattr(signal, name))
            _wait_for(proc, [tmp_path / f"got.{r}.{name}" for r in ranks])
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert all((tmp_path / f"done.{r}").is_file() for r in ranks), err[-3000:]
    for r in ranks:  # once each: the launcher sent it to the rank, nobody twice
        for name in ("SIGUSR1", "SIGUSR2"):
            assert len((tmp_path / f"got.{r}.{name}").read_text().split()) == 1
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest.get("failed_ranks") or []) == ("ok", []), manifest
