"""A rank's end under signals: a Ctrl-C or SIGTERM to a job started with it ignored,
one that arrives while the trace is written, and a rank killed while gpudiag finishes
its record (issue 28; the CI failure of test_ctrl_c_to_a_lightning_job...)."""

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
from gpudiag.capture.profiling import signals_held
from tests.traced_jobs import start_trace

SINGLE_SCRIPT = Path(__file__).parent / "scripts" / "capture_single.py"
IGNORED_SIGNAL_SCRIPT = Path(__file__).parent / "scripts" / "ignored_signal_job.py"
JOB_TIMEOUT_S = 240


def _status(out: Path, rank: int = 0) -> dict:
    return json.loads((rundir.rank_dir(out, rank) / rundir.STATUS).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_the_launcher_inherited_ignored_stays_ignored(tmp_path: Path, name: str) -> None:
    """`gpudiag trace ... &` in a shell script starts with SIGINT ignored (``trap ''
    TERM`` or a supervisor can ignore SIGTERM): under plain python the script trains on
    through that signal. The launcher handled it and forwarded it to a rank it had reset
    to the default, and the job was interrupted (probe 28j, F4: 15 of 17 runs, plain
    8 of 8 trained on). Now it is neither handled nor forwarded, and the rank inherits
    the ignore."""
    out, seen = tmp_path / "run", tmp_path / "disposition.txt"
    signum = getattr(signal, name)

    def ignore() -> None:
        signal.signal(signum, signal.SIG_IGN)

    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
         "--no-profile", str(IGNORED_SIGNAL_SCRIPT), name, str(seen)],
        cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
        text=True, timeout=JOB_TIMEOUT_S, preexec_fn=ignore,
    )  # fmt: skip
    err = proc.stderr[-3000:]
    assert proc.returncode == 0, err
    assert "trained on" in proc.stdout, err
    assert seen.read_text() == "ignored", err
    assert _status(out)["status"] == "ok"
    assert json.loads((out / "manifest.json").read_text())["status"] == "ok"


@pytest.mark.slow
def test_a_rank_killed_while_gpudiag_finishes_keeps_an_early_status(tmp_path: Path) -> None:
    """The script's loop ended; gpudiag waits for its non-daemon thread (as interpreter
    exit would) before the trace and tables. A rank killed there (a grace period that ran
    out on a loaded host) still says how its code ended, and that its record may be
    incomplete, in status.json and the manifest."""
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--no-lint", "--no-profile", str(SINGLE_SCRIPT),
         "--steps", "20", "--linger", "600"],
        tmp_path,
    )  # fmt: skip
    status_path = rundir.rank_dir(out, 0) / rundir.STATUS
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not status_path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    early = _status(out)
    assert early[rundir.STATUS_FINISHING] is True and early["status"] == "ok", early
    assert early["steps_completed"] == 20
    assert not rundir.final_status_written(out, 0)
    pid = json.loads((rundir.rank_dir(out, 0) / rundir.RANK_INFO).read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    status = _status(out)
    assert status["status"] == "ok" and rundir.ENDED_WHILE_FINISHING in status["incomplete"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"rank 0: {rundir.ENDED_WHILE_FINISHING}" in manifest["incomplete"], err[-3000:]
    assert "wrote no status" not in err


def test_signals_held_defers_one_signal_and_lets_a_second_through() -> None:
    """While held (the trace being written), one Ctrl-C waits and is raised after; a
    second one is raised at once. Real signals to this process (pytest's main thread)."""
    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, and must not raise
        reached.append("the end of the block")
    assert reached == ["the end of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        reached.append("after the second")  # not reached
    assert reached == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_signals_held_gives_a_held_sigterm_to_the_handler_in_place() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
