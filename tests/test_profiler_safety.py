"""The traced process never crashes because of the profiler window (issue 28).

The issue's script (a `gpudiag.region` around every step, nothing else) crashed with
SIGSEGV in 3 to 5 of 6 runs on a loaded host when gpudiag stopped one torch profiler and
started another inside the open region (docs/reliability.md). Here it runs under
`gpudiag trace` beside a CPU hog, several times: every run must end cleanly, with the
default window's trace (steps 5-9, warm-up cut). `python bench/crash_stress.py` runs the
200-run version of this.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag import rundir

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "region_loop.py"
RUNS = 2


@pytest.fixture
def cpu_hog() -> object:
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    yield hog
    hog.kill()
    hog.wait()


def test_region_around_every_step_never_crashes_the_traced_process(
    tmp_path: Path, cpu_hog: object
) -> None:
    for i in range(RUNS):
        out = tmp_path / f"run{i}"
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), str(SCRIPT)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, (i, proc.stdout[-2000:], proc.stderr[-2000:])
        manifest = json.loads((out / rundir.MANIFEST).read_text())
        assert manifest["status"] == "ok" and manifest["steps_completed"] == {"0": 30}
        with gzip.open(rundir.trace_path(out, 0)) as fh:
            names = {e.get("name") for e in json.load(fh)["traceEvents"]}
        steps = sorted(n for n in names if str(n).startswith("ProfilerStep#"))
        assert steps == [f"ProfilerStep#{k}" for k in range(5, 10)], steps


OWN_PROFILER = Path(__file__).parent / "scripts" / "own_profiler.py"
OWN_PROFILER_MID_WINDOW = Path(__file__).parent / "scripts" / "own_profiler_mid_window.py"
OWN_PROFILER_IN_MODULE = Path(__file__).parent / "scripts" / "own_profiler_in_module.py"


@pytest.mark.parametrize(
    ("script", "steps"),
    [(OWN_PROFILER, 15), (OWN_PROFILER_MID_WINDOW, 16), (OWN_PROFILER_IN_MODULE, 14)],
    ids=["schedule", "mid", "module"],
)
def test_script_with_its_own_profiler_keeps_it_and_is_never_crashed(
    tmp_path: Path, cpu_hog: object, script: Path, steps: int
) -> None:
    for i in range(RUNS):
        out = tmp_path / f"own{i}"
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out),
             str(script)],
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, (i, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "runs torch.profiler itself" in proc.stdout + proc.stderr
        manifest = json.loads((out / rundir.MANIFEST).read_text())
        assert manifest["status"] == "ok" and manifest["steps_completed"] == {"0": steps}
        assert not rundir.trace_path(out, 0).exists()


def test_region_names_a_script_passes_by_mistake_never_raise_into_the_step(
    tmp_path: Path,
) -> None:
    """None, a number, a lone surrogate, a 10,000-character name: gpudiag.region took
    them to torch's record_function, which raised into the step (the job failed) where
    untraced the region ignores its argument. The run is analysed without a bad row."""
    out = tmp_path / "run"
    script = Path(__file__).parent / "scripts" / "region_names.py"
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / rundir.MANIFEST).read_text())["steps_completed"] == {"0": 20}
    rows = [json.loads(line) for line in (out / "rank0" / "regions.jsonl").read_text().splitlines()]
    assert {r["name"] for r in rows} >= {"None", "123", "f?", "ok"}
    assert max(len(r["name"]) for r in rows) <= 200
    analyzed = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]


def test_step_from_another_thread_never_crashes_the_job(tmp_path: Path) -> None:
    """Only the thread that runs the steps starts, stops and exports the profiler."""
    script = Path(__file__).parent / "scripts" / "step_from_thread.py"
    for i in range(2):
        out = tmp_path / f"run{i}"
        cmd = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out)]
        proc = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (i, proc.stderr[-2000:])
        assert "done" in proc.stdout
        assert json.loads((out / rundir.MANIFEST).read_text())["status"] == "ok"


PREFETCH_THREAD = Path(__file__).parent / "scripts" / "prefetch_thread_ddp.py"


def test_a_prefetch_thread_that_takes_the_first_batch_never_crashes_the_job(
    tmp_path: Path,
) -> None:
    """The steps belong to the thread that ends them (runs the optimizer), not to the
    prefetch thread that took the first batch: the profiler starts and stops there."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, "--standalone", "--out", str(out), str(PREFETCH_THREAD)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    manifest = json.loads((out / rundir.MANIFEST).read_text())
    assert manifest["status"] == "ok" and manifest["steps_completed"] == {"0": 32, "1": 32}
    for rank in (0, 1):
        with gzip.open(rundir.trace_path(out, rank)) as fh:
            events = json.load(fh)["traceEvents"]
        steps = {e.get("name") for e in events if str(e.get("name")).startswith("ProfilerStep#")}
        assert steps, rank
        # the window's ops are the training thread's: its forward and its optimizer step
        names = {e.get("name") for e in events}
        assert "aten::addmm" in names and any("Optimizer.step" in str(n) for n in names)


THREAD_SHAPES = Path(__file__).parent / "scripts" / "thread_shapes.py"


def _trace_shape(out: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), *args]
    return subprocess.run(
        [*cmd, str(THREAD_SHAPES), mode], capture_output=True, text=True, timeout=300
    )


def test_each_step_in_a_new_thread_never_crashes_the_job(tmp_path: Path) -> None:
    """The thread that started the profiler is gone when the window ends (a new thread
    may even get its ident): no stop, no export, one line; before, SIGSEGV in 5 of 5."""
    proc = _trace_shape(tmp_path / "run", "stepthread")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    status = json.loads((rundir.rank_dir(tmp_path / "run", 0) / rundir.STATUS).read_text())
    assert status["status"] == "ok" and status["steps_completed"] == 12
    assert "started in a thread that has ended" in status["profile_error"]
    # on stderr: the job's stdout is the job's (issue 28 probe 28c)
    assert "profiler trace not written" in proc.stderr
    assert "profiler trace not written" not in proc.stdout


def test_a_thread_that_ran_the_model_before_the_first_step_does_not_begin_it(
    tmp_path: Path,
) -> None:
    """An evaluation thread's forward before the training loop is not step 0: the window
    0-0 is the training thread's first step (before, no trace and no word of why)."""
    out = tmp_path / "run"
    proc = _trace_shape(out, "earlyend", "--profile-steps", "0-0")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    with gzip.open(rundir.trace_path(out, 0)) as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert "ProfilerStep#0" in names and "aten::addmm" in names


def _trace_names(out: Path) -> set[str]:
    with gzip.open(rundir.trace_path(out, 0)) as fh:
        return {e.get("name") for e in json.load(fh)["traceEvents"]}


@pytest.mark.parametrize(
    ("mode", "window"),
    [("stepper", "5-9"), ("threadloop", "5-9"), ("chunks", "4-4")],
)
def test_a_window_ending_in_a_thread_that_never_loads_a_batch_again_is_exported(
    tmp_path: Path, mode: str, window: str
) -> None:
    """The window stops as its last Optimizer.step returns, in the thread that runs the
    steps: an optimizer stepped by a thread of its own that never loads a batch, a loop
    in a thread of its own whose window ends on its last step, a window inside one of
    several short-lived threads. Before (third probe), each waited for a next batch or
    forward in that thread that never came, and the trace was lost with a wrong reason."""
    out = tmp_path / "run"
    proc = _trace_shape(out, mode, "--profile-steps", window)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    status = json.loads((rundir.rank_dir(out, 0) / rundir.STATUS).read_text())
    assert status["status"] == "ok" and status["profile_error"] is None, status
    first, last = (int(x) for x in window.split("-"))
    names = _trace_names(out)
    assert {f"ProfilerStep#{k}" for k in range(first, last + 1)} <= names, sorted(
        n for n in names if n and n.startswith("ProfilerStep")
    )
    assert "Optimizer.step#SGD.step" in names


def test_a_window_begun_in_a_thread_that_then_ended_says_what_to_choose(tmp_path: Path) -> None:
    """Steps 6-8 run in a new thread, but the profiler started at step 5's end in the
    thread before, which then ended: no trace (stopping it elsewhere crashes torch), and
    the reason says to choose a window within one thread's steps."""
    out = tmp_path / "run"
    proc = _trace_shape(out, "chunks", "--profile-steps", "6-8")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    status = json.loads((rundir.rank_dir(out, 0) / rundir.STATUS).read_text())
    assert status["status"] == "ok" and status["steps_completed"] == 12
    assert "within one thread's steps" in status["profile_error"], status


COMPILED = Path(__file__).parent / "scripts" / "compiled_loop.py"
COMPILE_HOOK_WARNING = "when there are global hooks on modules"


@pytest.mark.parametrize("own_hook", [False, True], ids=["plain", "own_hook"])
def test_torch_compile_sees_the_same_hooks_under_trace(tmp_path: Path, own_hook: bool) -> None:
    """torch.compile(module) warns while any global module hook exists: under `gpudiag
    trace` it warned twice about gpudiag's own first-forward hook (issue 28 probe, K03),
    which plain python never prints. A script with a global hook of its own still gets
    the warning, traced or not."""
    extra = ["--own-hook"] if own_hook else []
    traced = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(tmp_path / "run"),
         str(COMPILED), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    plain = subprocess.run(
        [sys.executable, str(COMPILED), *extra], capture_output=True, text=True, timeout=300
    )
    for proc in (traced, plain):
        assert proc.returncode == 0 and "DONE_OK" in proc.stdout, proc.stderr[-2000:]
    assert (COMPILE_HOOK_WARNING in plain.stderr) is own_hook, plain.stderr[-2000:]
    assert (COMPILE_HOOK_WARNING in traced.stderr) is own_hook, traced.stderr[-2000:]
    manifest = json.loads((tmp_path / "run" / rundir.MANIFEST).read_text())
    assert manifest["status"] == "ok" and manifest["steps_completed"] == {"0": 15}
