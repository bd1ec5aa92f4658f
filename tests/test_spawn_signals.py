"""Ctrl-C to a job whose ranks the script starts itself (mp.spawn): a terminal sends SIGINT
to every process of its foreground group, so each worker runs its own clean-up. gpudiag
starts the job in a session of its own and forwarded the signal to the job's top process
only: the workers never saw it, and were SIGKILLed 30 s later with no checkpoint and no
status (probe 28g, N1, 3 of 3). The signal now goes to the job's process group."""

from __future__ import annotations

import json
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


def _trace_until(tmp_path: Path, mark: str, script: Path, *args: str) -> subprocess.Popen:
    """``gpudiag trace script args`` in a session of its own (a terminal's foreground
    group: gpudiag alone), once both ranks wrote ``<mark>.<rank>`` (no timing margin:
    the files say the ranks train)."""
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", str(script), *args]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"{mark}.{r}").exists() for r in (0, 1)):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the ranks never trained (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.2)
    return proc


@pytest.mark.slow
def test_ctrl_c_reaches_the_workers_mp_spawn_started(tmp_path: Path) -> None:
    proc = _trace_until(tmp_path, "started", SCRIPT, str(_free_port()))
    try:
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


HANDLERS_SCRIPT = Path(__file__).parent / "scripts" / "spawn_own_handlers.py"
OWN_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["spawn", "fork", "process"])
def test_the_scripts_own_handlers_survive_init_process_group_and_run(
    tmp_path: Path, mode: str
) -> None:
    """Issue 28, NEW-1: an mp.spawn worker's SIGTERM handler, installed before its
    init_process_group, was replaced by gpudiag's when the rank set up at that call:
    ``getsignal`` said the default, and the job's SIGTERM raised KeyboardInterrupt
    instead of running the handler (no checkpoint). The same with the handlers a
    fork-started rank inherits from its parent (SIGUSR2 too: the fork reset it) and in
    the fork-context ``multiprocessing.Process`` ranks gpudiag does not trace (which also
    took the traced rank's directory over). Real 2-rank gloo jobs, a real SIGTERM to
    ``gpudiag trace``, which forwards it to the job's process group."""
    proc = _trace_until(tmp_path, "ready", HANDLERS_SCRIPT, str(_free_port()), mode)
    try:
        os.kill(proc.pid, signal.SIGTERM)  # to gpudiag: it forwards to the job's group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    whose = ["0", "1", "main"] if mode == "fork" else ["0", "1"]
    for who in whose:
        seen = json.loads((tmp_path / f"ready.{who}").read_text())
        # what signal.getsignal said after init_process_group and a DDP step
        assert seen == dict.fromkeys(OWN_SIGNALS, True), (who, seen, err[-3000:])
    saved = sorted(p.name for p in tmp_path.glob("ckpt.*"))
    assert saved == [f"ckpt.{who}.SIGTERM" for who in sorted(whose)], (saved, out, err[-3000:])
    if mode == "process":  # untraced ranks: the traced process keeps its own record
        assert (tmp_path / "run" / "rank0" / "status.json").is_file(), err[-3000:]
        assert not (tmp_path / "run" / "rank1").exists(), err[-3000:]
        assert "deleted while the run wrote it" not in err, err[-3000:]
        return
    for rank in (0, 1):
        status = json.loads((tmp_path / "run" / f"rank{rank}" / "status.json").read_text())
        assert (status["status"], status["exit_code"], status["exc_type"]) == (
            "interrupted",
            42,
            "SIGTERM",
        ), status
        assert status["message"] == "sys.exit(42) in the script's SIGTERM handler", status


def test_gpudiag_takes_sigterm_only_where_the_default_is() -> None:
    """The rules behind the test above, in one fresh process: a rank set up after the
    script's code ran (mp.spawn's, at init_process_group) keeps a SIGTERM handler or
    SIG_IGN the script set; the default is gpudiag's to stand in for; at a process's
    start (nothing of the script has run) it is taken as before. A forked child keeps a
    fatal-signal handler of the script's; a handler of several signals is named by the
    one it was called for. A handler of the hang dump's signal stays the script's."""
    code = """
import os, signal, sys
from gpudiag.capture import worker_signals as ws
own = lambda s, f: None
signal.signal(signal.SIGTERM, own)
ws.take_sigterm()
assert signal.getsignal(signal.SIGTERM) is own
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ws.take_sigterm()
assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
signal.signal(signal.SIGTERM, signal.SIG_DFL)
ws.take_sigterm()
assert ws.real_getsignal(signal.SIGTERM) is ws._on_sigterm
signal.signal(signal.SIGTERM, own)
ws.take_sigterm(at_start=True)
assert ws.real_getsignal(signal.SIGTERM) is ws._on_sigterm
ws.hide_own_handlers()
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # gpudiag's, disguised
signal.signal(signal.SIGUSR2, own)
ws._FATAL_HANDLED.append(signal.SIGUSR2)
ws._forked_child()
assert signal.getsignal(signal.SIGUSR2) is own
def on_any(signum, frame):
    sys.exit(7)
for name in ("SIGINT", "SIGTERM"):
    signal.signal(getattr(signal, name), on_any)
ws._note_script_handlers()
try:
    on_any(signal.SIGTERM, None)
except SystemExit as exc:
    assert ws._handled_signal(exc.__traceback__) == "SIGTERM", ws._handled_signal(exc.__traceback__)
import tempfile
from pathlib import Path
from gpudiag.capture import hangdump
ran = []
signal.signal(hangdump.STACK_DUMP_SIGNAL, lambda s, f: ran.append(s))
hangdump.install_hang_dump(Path(tempfile.mkdtemp()), 0)
signal.raise_signal(hangdump.STACK_DUMP_SIGNAL)
assert ran == [hangdump.STACK_DUMP_SIGNAL], ran
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


DIES_SCRIPT = Path(__file__).parent / "scripts" / "spawn_rank_dies.py"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "osexit"])
def test_a_spawned_rank_that_dies_without_status_is_the_cause_not_its_terminated_peer(
    tmp_path: Path, how: str
) -> None:
    """Probe 28i, F6: rank 1 of an mp.spawn job SIGKILLed from outside (an OOM killer)
    or ending with ``os._exit(3)``; torch's spawn parent then SIGTERMs rank 0. The
    manifest blamed rank 0, "ended by SIGTERM from outside the job"; rank 1 is the
    cause, rank 0 a consequence of the parent's shutdown."""
    port = {"kill": 29464, "osexit": 29465}[how]
    proc = _trace_until(tmp_path, "ready", DIES_SCRIPT, str(port), how)
    try:
        if how == "kill":
            os.kill(int((tmp_path / "ready.1").read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    failure = manifest["failure"]
    # rank 0 either lost the connection (a peer error, listed after the cause) or was
    # ended by the spawn parent's SIGTERM first: a consequence in both cases
    assert (manifest["status"], manifest["failed_ranks"][0]) == ("failed", 1), err[-3000:]
    assert failure["rank"] == 1 and "outside the job" not in failure["message"], failure
    assert [c["rank"] for c in failure["consequences"]] == [0], failure
    assert "rank 1 failed" in err and "rank 0 failed" not in err, err[-3000:]


SLOW_START_SCRIPT = Path(__file__).parent / "scripts" / "spawn_slow_start.py"


def _interrupted_without_a_failed_rank(tmp_path: Path, proc: subprocess.Popen) -> None:
    """SIGTERM to ``gpudiag trace``; the run must be an interrupt that blames nobody."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_ranks"]) == ("interrupted", []), manifest
    assert manifest["failure"] is None and "failed" not in err, err[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM


@pytest.mark.slow
def test_sigterm_while_spawned_workers_start_is_an_interrupt_not_a_rank_failure(
    tmp_path: Path,
) -> None:
    """Probe 28i, F5: SIGTERM to `gpudiag trace` while mp.spawn's workers were still
    starting (no handler yet: they die of it without a status) was recorded as rank 0
    "died from exit code 143 before its first step"; the forwarded signal is an
    interrupt. The workers say when they are starting: no timing margin."""
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", str(SLOW_START_SCRIPT)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("importing.*"))) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    _interrupted_without_a_failed_rank(tmp_path, proc)


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.8, 1.6, 2.4, 3.2])
def test_sigterm_at_any_moment_of_a_spawn_jobs_start_up_blames_no_rank(
    tmp_path: Path, delay_s: float
) -> None:
    """The same at fixed delays after the start (probe 28i's sweep: 2-3 of 7 delays
    blamed rank 0): whatever phase the signal meets, no rank failed."""
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
               "--no-lint", "--no-profile", str(DIES_SCRIPT), "29467", "kill"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "run" / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the launcher's handlers are in place once it wrote this
    time.sleep(delay_s)
    _interrupted_without_a_failed_rank(tmp_path, proc)


ATEXIT_SCRIPT = Path(__file__).parent / "scripts" / "spawn_atexit.py"


def _atexit_marks(cwd: Path, command: list[str]) -> list[str]:
    """Whose atexit handlers ran (one entry per run of a handler) for ``command``."""
    cwd.mkdir()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(p.name.rsplit(".", 1)[0] for p in cwd.glob("atexit.*"))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_spawned_ranks_run_the_atexit_handlers_python_runs(tmp_path: Path, method: str) -> None:
    """Probe 28i, F1: a fork-started torch.multiprocessing worker ends with os._exit, so
    no atexit handler runs in it; under gpudiag each fork rank ran them all (the
    parent's ran 3 times: an rmtree of its tmpdir, an upload, once per rank). A spawn
    worker ends with sys.exit: its own handlers run, traced or not."""
    port = {"fork": 29468, "spawn": 29469}[method]
    script = [str(ATEXIT_SCRIPT), str(port), method]
    plain = _atexit_marks(tmp_path / "plain", [sys.executable, *script])
    traced = _atexit_marks(
        tmp_path / "traced",
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"),
         "--no-lint", "--no-profile", *script],
    )  # fmt: skip
    expected = ["atexit.parent"] + ([] if method == "fork" else ["atexit.rank0", "atexit.rank1"])
    assert plain == expected
    assert traced == plain
