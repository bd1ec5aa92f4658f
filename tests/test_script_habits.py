"""Scripts with habits of their own, run for real under `gpudiag trace` (issue 28, probe
28e): each failed or hung the job before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.lint import lint_paths

SCRIPTS = Path(__file__).parent / "scripts"
JOB_TIMEOUT_S = 240


def _trace(tmp_path: Path, *target: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(tmp_path / "run"), "--no-lint",
         *target],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )  # fmt: skip


def _steps(run: Path) -> int:
    return len(rundir.load_run(run).steps)


@pytest.mark.slow
def test_torch_jit_trace_before_training_is_not_traced_into(tmp_path: Path) -> None:
    """gpudiag's first-forward hook opened its ProfilerStep range inside the script's
    torch.jit.trace: the range became an op of the traced graph and the trace's check
    failed the job (TracingCheckError)."""
    proc = _trace(tmp_path, str(SCRIPTS / "jit_trace_first.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "JIT_TRACE_DONE" in proc.stdout
    assert _steps(tmp_path / "run") == 6


@pytest.mark.slow
def test_the_script_sees_builtins_as_python_gives_them(tmp_path: Path) -> None:
    """`__builtins__` of a script's __main__ is the builtins module under python; runpy
    gave the module's dict (AttributeError: 'dict' object has no attribute 'print')."""
    proc = _trace(tmp_path, str(SCRIPTS / "builtins_module.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BUILTINS_MODULE_DONE module" in proc.stdout


@pytest.mark.slow
def test_a_script_that_joins_every_thread_ends(tmp_path: Path) -> None:
    """gpudiag's threads in the training process (signals, launcher watch, hang dump)
    never end: a script joining every thread waited forever."""
    proc = _trace(tmp_path, str(SCRIPTS / "join_all_threads.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "JOINED_ALL_THREADS" in proc.stdout


def test_a_missing_module_is_one_line_and_no_run(tmp_path: Path) -> None:
    """`-m` a module python cannot find: python's words and exit code 1, no run directory
    (was the rank's traceback and a failed run)."""
    proc = _trace(tmp_path, "-m", "no_such_module_gpudiag_test")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "gpudiag: trace: No module named no_such_module_gpudiag_test"
    assert not (tmp_path / "run").exists()


def test_lint_refuses_a_fifo_and_a_device_in_a_sources_place(tmp_path: Path) -> None:
    """Lint (which `gpudiag trace` runs on the script) read a FIFO until it blocked and
    /dev/zero until memory ran out."""
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    (tmp_path / "train.py").write_text("import torch\n")
    result = lint_paths([tmp_path])
    problems = {Path(e.path).name: e.message for e in result.errors}
    assert set(problems) == {"fifo.py", "zero.py"}
    assert "FIFO" in problems["fifo.py"] and "device" in problems["zero.py"]
