"""The process that called torch.multiprocessing.spawn dies (2 gloo ranks, real signals).

- F1 (probe 28j): killed from outside (SIGKILL, or a SIGUSR1 it does not handle), its
  workers get torch's parent-death SIGINT, and gpudiag blamed a rank, "ended by SIGINT
  from outside the job". The parent's death is the cause, the ranks' interrupts its
  consequences, no rank in ``failed_ranks``.
- F4 (probe 28i): the launcher SIGKILLed. Under plain python the script's process dies
  and its workers get the parent-death SIGINT at once; under gpudiag the parent got
  SIGTERM, ended gracefully and waited for its workers, which trained on until the
  launcher watch's 15 s grace ran out. The parent now dies with the launcher
  (parent-death SIGKILL): the ranks end on torch's SIGINT, not on gpudiag's polling.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from tests.signalled_jobs import start_job

# from the launcher's SIGKILL to the end of every process of the job: the parent-death
# signal acts at once, the ranks then write their status (1-3 s here under load); the
# launcher watch's fallback took 15 s more
PROMPT_S = 12.0


def _spawn_parent(launcher: int) -> int:
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGKILL", "SIGUSR1"])
def test_the_spawn_parents_death_is_the_cause_not_a_rank(tmp_path: Path, name: str) -> None:
    proc = start_job(tmp_path, "spawn", [])
    try:
        os.kill(_spawn_parent(proc.pid), getattr(signal, name))
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    signum = int(getattr(signal, name))
    assert proc.returncode == 128 + signum, err[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    failure = manifest["failure"]
    assert (manifest["status"], manifest["failed_ranks"]) == ("failed", []), manifest
    assert (failure["rank"], failure["signal"]) == (None, name), failure
    assert f"torch.multiprocessing.spawn died of {name}" in failure["message"], failure
    assert failure["consequences"] == [0, 1], failure
    assert "from outside the job" not in err


@pytest.mark.slow
def test_the_spawned_ranks_end_at_once_when_the_launcher_is_killed(tmp_path: Path) -> None:
    proc = start_job(tmp_path, "spawn", [])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        # the job's processes hold the launcher's stdout and stderr: EOF once all ended
        out, err = proc.communicate(timeout=120)
        ended_s = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "the launcher is gone" not in err, err[-3000:]  # not the 1 Hz polling fallback
    for rank in (0, 1):
        status = json.loads((rundir.rank_dir(tmp_path / "run", rank) / rundir.STATUS).read_text())
        assert (status["status"], status["exc_type"]) == ("interrupted", "KeyboardInterrupt")
    assert ended_s < PROMPT_S, f"the ranks ran on {ended_s:.1f} s after the launcher died"
