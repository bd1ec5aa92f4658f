"""Ctrl-C (or SIGTERM) to `gpudiag trace` while the traced process is still importing
torch (gpudiag's set-up imports it before the script's first line). Python drops the
half-run ``torch`` module but keeps torch._C and its C++ registrations; the finish
path set up again at exit (and looked for a process group), importing torch a second
time: that re-ran torch/__init__.py over them and the process died of SIGABRT
("generic_type: cannot initialize type "GradBucket": an object with that name is
already defined", from torch._C._c10d_init) or SIGSEGV before status.json, and the
launcher blamed rank 0 for a native crash (probe 28j, F2: 7 of 28 runs, mp.spawn
scripts; single-process scripts too). Nothing at exit imports torch then.

And the KeyboardInterrupt is never raised inside gpudiag's set-up at all: where torch's
C++ calls back into Python (torch._C._c10d_init) it cannot propagate and the process
aborted (std::terminate: 2 of 55 runs), and in a guarded set-up step (the elastic note's
import of torch.distributed.launcher.api) it was swallowed and the job trained on to
``ok`` (the lost Ctrl-C, 4 of 55). gpudiag holds Ctrl-C until the script starts
(capture/deferred_signals.py): the script is interrupted before its first line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SITE = Path(__file__).parent / "scripts" / "interrupt_in_torch_import"
REPO = Path(__file__).resolve().parent.parent

SPAWN_JOB = """\
import torch, torch.multiprocessing as mp

def work(i):
    print("rank", i)

if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "at",
    [
        "torch.distributed.device_mesh",
        "torch.fx",
        "torch.distributed.distributed_c10d",
        "torch.distributed.launcher.api",  # gpudiag's set-up, after torch's import
    ],
)
def test_ctrl_c_inside_torchs_import_ends_the_job_interrupted_without_a_crash(
    tmp_path: Path, at: str
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SPAWN_JOB)
    log = tmp_path / "reimports.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["GPUDIAG_TEST_INTERRUPT_AT"] = at
    env["GPUDIAG_TEST_REIMPORT_LOG"] = str(log)
    raised = tmp_path / "raised.txt"
    env["GPUDIAG_TEST_RAISED_LOG"] = str(raised)
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
    )
    err = proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr, err
    assert "failed at exit" not in proc.stderr, err
    assert not log.exists(), log.read_text() + err
    assert not raised.exists(), raised.read_text() + err
    assert proc.returncode == 130, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", err
    assert not manifest.get("failed_ranks"), (manifest.get("failure"), err)
    status = json.loads((run / "rank0" / "status.json").read_text())
    assert status["status"] == "interrupted", status
    assert status["exc_type"] == "KeyboardInterrupt", status
    assert status["message"] == "before the script started", status


SITE_STARTUP = Path(__file__).parent / "scripts" / "interrupt_in_site_startup"


@pytest.mark.slow
def test_ctrl_c_during_the_traced_processs_site_start_up_blames_no_rank(tmp_path: Path) -> None:
    """A Ctrl-C that raises KeyboardInterrupt in the traced process's site start-up (a
    .pth file's import, sitecustomize), before any of gpudiag runs there: python ends it
    with "Fatal Python error: init_import_site", exit 1, no status.json. The launcher
    forwarded that Ctrl-C: the run is interrupted and no rank is blamed (before: rank 0
    "died from exit code 1 before its first step")."""
    script = tmp_path / "job.py"
    script.write_text(SPAWN_JOB)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE_STARTUP), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    run = tmp_path / "run"
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint",
               "--no-profile", str(script)]  # fmt: skip
    proc = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    err = proc.stderr[-3000:]
    assert "init_import_site" in proc.stderr, err  # it was interrupted where meant
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", err
    assert not manifest.get("failed_ranks"), (manifest.get("failure"), err)
    assert manifest.get("failure") is None, err


@pytest.mark.slow
def test_ctrl_c_inside_the_agents_torch_import_waits_for_torchrun(tmp_path: Path) -> None:
    """`--nproc-per-node`: gpudiag's agent imports torch's elastic stack before it runs
    torchrun. A Ctrl-C forwarded then is held until torchrun would start, never raised
    inside torch's import (before: a KeyboardInterrupt traceback out of the import of
    torch.fx, where a C++ callback could have aborted the agent); the run is interrupted
    before any rank started, none blamed."""
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    raised = tmp_path / "raised.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["GPUDIAG_TEST_INTERRUPT_AT"] = "torch.fx"
    env["GPUDIAG_TEST_RAISED_LOG"] = str(raised)
    run = tmp_path / "run"
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint",
               "--no-profile", "--nproc-per-node", "2", "--master-port", "42043", str(script)]  # fmt: skip
    proc = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    err = proc.stderr[-3000:]
    assert not raised.exists(), raised.read_text() + err
    assert "Traceback" not in proc.stderr, err
    assert proc.returncode == 130, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", err
    assert not manifest.get("failed_ranks"), (manifest.get("failure"), err)
