"""Every signal whose default action ends a process, sent to `gpudiag trace` itself
(probe 28j, F3). The SIGUSR1/2 fix (test_user_signals.py) left SIGQUIT, SIGALRM,
SIGPWR, SIGXCPU & co. at their default in the launcher: it died of them, its manifest
stayed ``running`` and mp.spawn's ranks ran on orphaned. Now, as under plain python or
torchrun: a signal some process of the job handles reaches that handler and the job goes
on; one nobody handles ends the job (its ranks write their status), the run
``interrupted`` with exit code 128 + the signal, and the manifest names it. Real jobs:
one process, 2 mp.spawn gloo ranks, 2 torchrun-style gloo ranks."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.signalled_jobs import RANKS, default_signals, start_job, wait_for


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True


def _manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())


UNHANDLED = [
    ("single", "SIGQUIT"),
    ("single", "SIGALRM"),  # the rank's stand-in for the default catches it
    ("spawn", "SIGQUIT"),
    ("spawn", "SIGALRM"),
    ("torchrun", "SIGQUIT"),  # torchrun's agent catches it to end its workers
    ("torchrun", "SIGXCPU"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "name"), UNHANDLED)
def test_a_signal_nobody_handles_ends_the_job_and_the_record_names_it(
    tmp_path: Path, mode: str, name: str
) -> None:
    proc = start_job(tmp_path, mode, [])
    rank_pids = [int((tmp_path / f"ready.{r}").read_text()) for r in RANKS[mode]]
    try:
        os.kill(proc.pid, getattr(signal, name))
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    signum = int(getattr(signal, name))
    assert proc.returncode == 128 + signum, err[-3000:]
    manifest = _manifest(tmp_path)
    assert (manifest["status"], manifest["exit_code"], manifest["failed_ranks"]) == (
        "interrupted", 128 + signum, []
    ), manifest  # fmt: skip
    assert manifest["launcher_signal"] == name
    assert f"gpudiag trace received {name}" in err
    assert all(_gone(pid) for pid in rank_pids), "a rank ran on after the job ended"


HANDLED = [("single", "SIGQUIT"), ("spawn", "SIGPWR"), ("torchrun", "SIGTRAP")]


def _handled_and_trained_on(
    tmp_path: Path, mode: str, name: str, preexec: Callable[[], None] | None = None
) -> None:
    """``name`` sent to `gpudiag trace` of a job whose ranks handle it: every rank's
    handler ran, the ranks trained on to their normal end, the run is `ok`."""
    proc = start_job(tmp_path, mode, [name], preexec=preexec)
    try:
        os.kill(proc.pid, getattr(signal, name))
        wait_for(proc, [tmp_path / f"got.{r}.{name}" for r in RANKS[mode]])
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    for r in RANKS[mode]:
        assert (tmp_path / f"done.{r}").is_file(), err[-3000:]
    manifest = _manifest(tmp_path)
    assert (manifest["status"], manifest["failed_ranks"]) == ("ok", []), manifest


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "name"), HANDLED)
def test_a_signal_the_ranks_handle_reaches_their_handlers_and_the_job_goes_on(
    tmp_path: Path, mode: str, name: str
) -> None:
    _handled_and_trained_on(tmp_path, mode, name)
    for r in RANKS[mode]:  # once each: the launcher sent it to the rank, nobody twice
        assert len((tmp_path / f"got.{r}.{name}").read_text().split()) == 1
    assert _manifest(tmp_path).get("launcher_signal") is None


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "name"), [("single", "SIGALRM"), ("torchrun", "SIGXCPU")])
def test_a_handler_of_a_passed_signal_that_exits_interrupts_and_blames_no_rank(
    tmp_path: Path, mode: str, name: str
) -> None:
    """The script's own SIGALRM / SIGXCPU handler saves, then sys.exit(7): the run was
    recorded `failed`, "rank 1 failed: SystemExit", as no SIGINT / SIGTERM / SIGQUIT /
    SIGUSR1 handler's was (probe 28k, C). It is the script's answer to the signal:
    interrupted, no rank blamed."""
    proc = start_job(tmp_path, mode, [name], env={"EXIT_IN_HANDLER": "7"})
    try:
        os.kill(proc.pid, getattr(signal, name))
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for r in RANKS[mode]:
        assert (tmp_path / f"got.{r}.{name}").is_file(), err[-3000:]
    manifest = _manifest(tmp_path)
    assert (manifest["status"], manifest["failed_ranks"]) == ("interrupted", []), manifest
    assert (manifest.get("failure") or {}).get("rank") is None, manifest


def _ignoring_sigint() -> None:
    default_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a shell script's `cmd &`


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "name", "ignored"),
    [("single", "SIGHUP", False), ("torchrun", "SIGHUP", False), ("single", "SIGINT", True),
     ("spawn", "SIGINT", True)],
)  # fmt: skip
def test_a_stop_the_script_handles_reaches_its_handler(
    tmp_path: Path, mode: str, name: str, ignored: bool
) -> None:
    """Under plain python a `kill -HUP` (or a Ctrl-C to a `cmd &` job, SIGINT inherited
    ignored) runs the script's own handler of it. The launcher turned SIGHUP into SIGTERM,
    and dropped an ignored SIGINT, so the handler never ran (probe 28k, A and B). Now
    each goes to the processes whose script handles it, and the job trains on."""
    _handled_and_trained_on(tmp_path, mode, name, _ignoring_sigint if ignored else None)
