"""The ways a script ends that the fifth independent probe found handled unlike python
or torchrun (issue 28): exit codes beyond a byte, atexit handlers using the process
group, an exception whose __str__ raises, a rank blocked in the rendezvous when its peer
fails or Ctrl-C comes, a one-process script that handles Ctrl-C and goes on."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from tests.traced_jobs import start_trace, wait_for_steps

SCRIPT = Path(__file__).parent / "scripts" / "exit_paths.py"
TIMEOUT_S = 240


def _trace(out: Path, mode: str, ranks: int = 1) -> subprocess.CompletedProcess:
    torchrun = ["--nproc-per-node", str(ranks)] if ranks > 1 else []
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint", *torchrun,
         str(SCRIPT), mode],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "code"), [("exit256", 0), ("exithuge", 255)])
def test_exit_codes_beyond_a_byte_are_what_python_gives(
    tmp_path: Path, mode: str, code: int
) -> None:
    """sys.exit(256) ends python with 0 (torchrun: success) and sys.exit(2**70) with 255;
    gpudiag said 1 and `failed` for both."""
    out = tmp_path / "run"
    traced = _trace(out, mode)
    plain = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True, timeout=120)
    assert plain.returncode == code
    assert traced.returncode == code, traced.stderr[-3000:]
    assert _json(out / "manifest.json")["status"] == ("ok" if code == 0 else "failed")


@pytest.mark.slow
def test_an_exception_whose_str_raises_is_printed_once_with_its_traceback(tmp_path: Path) -> None:
    out = tmp_path / "run"
    traced = _trace(out, "badstr")
    assert traced.returncode == 1
    assert traced.stderr.count("Traceback (most recent call last)") == 1, traced.stderr[-3000:]
    assert "Weird: <exception str() failed>" in traced.stderr
    status = _json(rundir.rank_dir(out, 0) / rundir.STATUS)
    assert (
        status["message"] == "<exception str() failed>" and "raise Weird()" in status["traceback"]
    )


@pytest.mark.slow
def test_atexit_handlers_still_have_the_process_group(tmp_path: Path) -> None:
    """Interpreter exit runs atexit handlers before anything tears the group down;
    gpudiag destroyed the group first and the handlers' all_reduce raised ValueError."""
    traced = _trace(tmp_path / "run", "atexit_ddp", ranks=2)
    assert traced.returncode == 0, traced.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: atexit all_reduce=2.0" in traced.stdout, traced.stderr[-3000:]
    assert "Default process group has not been initialized" not in traced.stderr


@pytest.mark.slow
def test_a_rank_blocked_in_the_rendezvous_ends_at_once_with_its_status(tmp_path: Path) -> None:
    """Rank 1 fails before init_process_group; rank 0 waits in the rendezvous, in C++,
    where its SIGTERM handler cannot run: torchrun SIGKILLed it 30 s later, no status
    (34.6 s in all). Now it ends within seconds, interrupted, and rank 1 is the cause."""
    out = tmp_path / "run"
    started = time.monotonic()
    traced = _trace(out, "preinit", ranks=2)
    took = time.monotonic() - started
    assert traced.returncode == 1, traced.stderr[-3000:]
    assert took < 25, took
    status = _json(rundir.rank_dir(out, 0) / rundir.STATUS)
    assert status["status"] == "interrupted" and "blocked in C code" in status["message"]
    assert "exit_paths.py" in status["message"], status["message"]
    manifest = _json(out / "manifest.json")
    assert manifest["failure"]["rank"] == 1 and manifest["missing_status_ranks"] == []


@pytest.mark.slow
def test_a_script_that_handles_ctrl_c_and_finishes_is_ok(tmp_path: Path) -> None:
    """One process: its SIGINT handler notes the signal and training goes on to the end.
    python exits 0; gpudiag said 130 and `interrupted`."""
    out = tmp_path / "run"
    proc = start_trace(["--out", str(out), "--no-lint", str(SCRIPT), "handles_sigint"], tmp_path)
    wait_for_steps(out, 1, 5, proc, TIMEOUT_S)
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=120)
    assert "finished after the signal [2]" in stdout, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert _json(out / "manifest.json")["status"] == "ok"


@pytest.mark.slow
def test_ctrl_c_reaches_a_rank_blocked_in_the_rendezvous(tmp_path: Path) -> None:
    """Ctrl-C while rank 0 waits in the rendezvous for a rank still sleeping: the
    KeyboardInterrupt cannot be raised in C++; torchrun SIGKILLed rank 0 30 s later,
    with no status. Now both ranks say how they ended, within about 10 s."""
    out = tmp_path / "run"
    proc = start_trace(
        ["--out", str(out), "--no-lint", "--nproc-per-node", "2", str(SCRIPT), "slow_init"],
        tmp_path,
    )
    info = rundir.rank_dir(out, 0) / rundir.RANK_INFO
    deadline = time.monotonic() + TIMEOUT_S
    while not info.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(3)  # rank 0 is in init_process_group by now
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert time.monotonic() - sent < 25, err[-3000:]
    for rank in (0, 1):
        status = _json(rundir.rank_dir(out, rank) / rundir.STATUS)
        assert status["status"] == "interrupted", status
    assert "blocked in C code" in _json(rundir.rank_dir(out, 0) / rundir.STATUS)["message"]


def _plain(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_a_script_recurses_as_deep_as_under_python_and_its_excepthook_prints(
    tmp_path: Path,
) -> None:
    """gpudiag's and runpy's frames under the script's module took 13 frames of the
    recursion limit; the script's sys.excepthook was bypassed (sixth probe)."""
    traced = _trace(tmp_path / "depth", "depth")
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert traced.stdout.strip().splitlines()[-1] == _plain("depth").stdout.strip()
    hooked = _trace(tmp_path / "hook", "excepthook")
    assert hooked.returncode == 1
    assert "CUSTOM HOOK: ValueError: handled by my excepthook" in hooked.stderr
    assert "Traceback" not in hooked.stderr, hooked.stderr[-3000:]


@pytest.mark.slow
def test_a_stray_sigusr1_ends_the_script_as_under_python(tmp_path: Path) -> None:
    """gpudiag dumped stacks on SIGUSR1, so a SIGUSR1 the script does not handle was
    swallowed and the job trained on; python dies of it (-10). The stack dump now
    uses a real-time signal."""
    out = tmp_path / "run"
    plain = _plain("sigusr1")
    assert plain.returncode == -signal.SIGUSR1 and "still running" not in plain.stdout
    traced = _trace(out, "sigusr1")
    assert traced.returncode == 128 + signal.SIGUSR1, traced.stderr[-3000:]
    assert "still running" not in traced.stdout
    assert _json(out / "manifest.json")["status"] == "failed"


@pytest.mark.slow
def test_analyze_never_prints_a_runs_terminal_escapes(tmp_path: Path) -> None:
    """An exception message with ESC colour codes and a right-to-left override reached
    the user's terminal raw through `gpudiag analyze` (sixth probe)."""
    out = tmp_path / "run"
    assert _trace(out, "ansi").returncode == 1
    report = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert "\x1b" not in report.stdout and "\u202e" not in report.stdout, report.stdout
    assert "\\x1b[31mRED" in report.stdout and "\\u202eRTL" in report.stdout


@pytest.mark.slow
def test_a_signal_whose_default_ends_the_process_leaves_the_status(tmp_path: Path) -> None:
    """SIGUSR2 (or SIGALRM) with no handler in the script ends python at once; the rank
    left no status.json (sixth probe). gpudiag now writes it, then dies of the signal."""
    out = tmp_path / "run"
    assert _plain("sigusr2").returncode == -signal.SIGUSR2
    traced = _trace(out, "sigusr2")
    assert traced.returncode == 128 + signal.SIGUSR2, traced.stderr[-3000:]
    assert "still running" not in traced.stdout
    status = _json(rundir.rank_dir(out, 0) / rundir.STATUS)
    assert (status["status"], status["exc_type"]) == ("interrupted", "SIGUSR2"), status
    assert status["steps_completed"] == 3
    manifest = _json(out / "manifest.json")
    assert manifest["failure"]["signal"] == "SIGUSR2", manifest["failure"]
    assert "wrote no status" not in traced.stderr


def _traceback_files(text: str, prefix: str = "[rank0]: ") -> list[str]:
    return re.findall(rf'^{re.escape(prefix)}  File "([^"]+)", line \d+', text, re.M)


@pytest.mark.slow
def test_a_ranks_traceback_has_the_frames_torchrun_shows(tmp_path: Path) -> None:
    """Probe 28c, defect 5: a rank's traceback began with gpudiag's `_run_callable`,
    `_run_target` and three `<frozen runpy>` frames, and showed gpudiag's DDP forward
    inside DDP's: the interpreter's print (torch's `[rank0]:` excepthook calls it) shows
    the exception's own traceback, not the one gpudiag had cut. Now the frames are
    those of the same script under torchrun, in the printed and the recorded traceback."""
    out = tmp_path / "run"
    traced = _trace(out, "ddp_raise", ranks=2)
    assert traced.returncode == 1, traced.stderr[-3000:]
    plain = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         str(SCRIPT), "ddp_raise"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    expected = _traceback_files(plain.stderr)
    assert expected and expected[0] == str(SCRIPT), plain.stderr[-3000:]
    shown = _traceback_files(traced.stderr)
    assert shown == expected, traced.stderr[-4000:]
    recorded = _json(rundir.rank_dir(out, 0) / rundir.STATUS)["traceback"]
    assert _traceback_files(recorded, prefix="") == expected, recorded


@pytest.mark.slow
def test_the_scripts_argv0_is_as_written_and_its_file_absolute(tmp_path: Path) -> None:
    """Probe 28d, defect 10: under `gpudiag trace` sys.argv[0] became the absolute path
    (runpy sets the path it is given); python and torchrun keep `scripts/intro.py`.
    `__file__` stays absolute, as python gives it."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "intro.py").write_text(
        "import sys\nprint('ARGV', sys.argv)\nprint('FILE', __file__)\n"
    )
    command = ["scripts/intro.py", "a1"]
    plain = subprocess.run(
        [sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    traced = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", "run", *command],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert traced.stdout == plain.stdout
    assert "ARGV ['scripts/intro.py', 'a1']" in traced.stdout
    assert f"FILE {tmp_path / 'scripts' / 'intro.py'}" in traced.stdout
