"""SIGUSR1 / SIGUSR2 to `gpudiag trace` (probe 28i, F3): under plain python the script's
handler runs and training goes on (SLURM ``--signal=USR1@N``, Lightning's requeue); the
launcher died of the default action, the job with it, its manifest left ``running``.
Now each reaches every rank that handles it, the launcher lives, the run ends ``ok``.
Real jobs: one process, 2 mp.spawn gloo ranks, 2 torchrun-style gloo ranks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.signalled_jobs import RANKS, start_job, wait_for


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "spawn", "torchrun"])
def test_sigusr_to_the_launcher_reaches_the_ranks_handlers_and_the_job_goes_on(
    tmp_path: Path, mode: str
) -> None:
    ranks = RANKS[mode]
    proc = start_job(tmp_path, mode, ["SIGUSR1", "SIGUSR2"])  # a SLURM requeue handler's
    try:
        for name in ("SIGUSR1", "SIGUSR2"):
            os.kill(proc.pid, getattr(signal, name))
            wait_for(proc, [tmp_path / f"got.{r}.{name}" for r in ranks])
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
