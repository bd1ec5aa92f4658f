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


def _traced_ok(tmp_path: Path, script: str, marker: str) -> subprocess.CompletedProcess:
    """The script traced ends with 0 and prints ``marker``, as under python."""
    proc = _trace(tmp_path, str(SCRIPTS / script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker in proc.stdout, proc.stdout[-2000:]
    return proc


@pytest.mark.slow
def test_torch_jit_trace_before_training_is_not_traced_into(tmp_path: Path) -> None:
    """gpudiag's first-forward hook opened its ProfilerStep range inside the script's
    torch.jit.trace: the range became an op of the traced graph and the trace's check
    failed the job (TracingCheckError)."""
    _traced_ok(tmp_path, "jit_trace_first.py", "JIT_TRACE_DONE")
    assert _steps(tmp_path / "run") == 6


@pytest.mark.slow
def test_the_script_sees_builtins_as_python_gives_them(tmp_path: Path) -> None:
    """`__builtins__` of a script's __main__ is the builtins module under python; runpy
    gave the module's dict (AttributeError: 'dict' object has no attribute 'print')."""
    _traced_ok(tmp_path, "builtins_module.py", "BUILTINS_MODULE_DONE module")


@pytest.mark.slow
def test_a_script_that_joins_every_thread_ends(tmp_path: Path) -> None:
    """gpudiag's threads in the training process (signals, launcher watch, hang dump)
    never end: a script joining every thread waited forever."""
    _traced_ok(tmp_path, "join_all_threads.py", "JOINED_ALL_THREADS")


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


@pytest.mark.slow
def test_compile_fullgraph_and_strict_export_run_as_under_python(tmp_path: Path) -> None:
    """gpudiag's global forward hook was traced by dynamo: `threading` in it failed
    torch.compile(fullgraph=True) ("Attempted to call function marked as skipped"), and
    its mere presence failed torch.export(strict=True) (probe 28f)."""
    _traced_ok(tmp_path, "compile_fullgraph_fn.py", "COMPILED_DONE True")
    assert _steps(tmp_path / "run") == 6


@pytest.mark.slow
def test_a_sigterm_handler_that_chains_checkpoints_and_exits_0(tmp_path: Path) -> None:
    """The script's handler chained to the one it replaced, gpudiag's, which ended the
    job before its checkpoint (exit 143). The script sees the default there, as under
    python."""
    proc = _traced_ok(tmp_path, "sigterm_chain.py", "GRACEFUL_STOP 5")
    assert "DEFAULT_BEFORE True" in proc.stdout
    assert (tmp_path / "ckpt.pt").is_file()


@pytest.mark.slow
def test_a_missing_submodule_is_pythons_one_line(tmp_path: Path) -> None:
    """`-m pkg.missing` (the package exists): runpy's traceback before; python's line and
    exit code 1 now. The launcher cannot tell without importing the package."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    proc = _trace(tmp_path, "-m", "pkg.missing")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{sys.executable}: No module named pkg.missing" in proc.stderr


@pytest.mark.slow
def test_a_default_put_back_by_the_script_still_writes_the_status(tmp_path: Path) -> None:
    """The script puts back the SIGTERM handler it read (the default, as gpudiag hides its
    own), as Lightning's teardown does; the parent-death SIGTERM then ended a re-executed
    rank with no status (the CI flake of test_lightning_rank0_failure_waits_for_the_
    followed_rank). It ends as under python (143), with its status written."""
    proc = _trace(tmp_path, str(SCRIPTS / "sigterm_restore_default.py"))
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "DEFAULT_BEFORE True" in proc.stdout and "RESTORED" in proc.stdout
    assert "NOT_REACHED" not in proc.stdout
    status = rundir.read_json(rundir.rank_dir(tmp_path / "run", 0) / rundir.STATUS)
    assert isinstance(status, dict) and status["status"] == "interrupted", proc.stderr[-3000:]
    assert status["steps_completed"] == 5


@pytest.mark.slow
def test_a_working_folder_that_takes_no_directory_still_runs_the_job(tmp_path: Path) -> None:
    """Probe 28f, class 10: from a read-only working folder (a container's read-only root
    filesystem; /sys here) python runs the script, and gpudiag refused it (exit 2,
    "cannot create the run directory"). The run goes to the temporary folder instead."""
    readonly = Path("/sys")
    try:
        (readonly / "gpudiag_probe").mkdir()
    except OSError:
        pass
    else:
        (readonly / "gpudiag_probe").rmdir()
        pytest.skip("/sys takes new directories here")
    script = tmp_path / "echo_args.py"
    script.write_text("import sys\nprint('ARGS', sys.argv[1:])\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", str(script), "a", "b"],
        cwd=readonly,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ARGS ['a', 'b']" in proc.stdout
    assert "the run goes to the temporary folder" in proc.stderr
    (run,) = (tmp_path / "gpudiag_runs").iterdir()
    assert rundir.read_json(run / rundir.MANIFEST)["status"] == "ok"
