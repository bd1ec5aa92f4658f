"""How a job ends when its terminal hangs up, when its own signal handler ends it, and
when it deletes the folder it runs in (issue 28, fourth probe: F1-F3)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from tests.traced_jobs import wait_for_steps

SCRIPT = Path(__file__).parent / "scripts" / "own_signal_handler.py"
JOB_TIMEOUT_S = 240


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _trace(tmp_path: Path, args: list[str], ignore_sighup: bool = False) -> subprocess.Popen:
    """`gpudiag trace ... own_signal_handler.py`, the script given by a relative path."""
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)

    def no_hangup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "gpudiag", "trace", "--out", "run", "--no-lint", *args,
         SCRIPT.name],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=no_hangup if ignore_sighup else None,
    )  # fmt: skip


@pytest.mark.slow
def test_the_scripts_own_signal_handler_sets_the_exit_code_and_no_rank_is_blamed(
    tmp_path: Path,
) -> None:
    """The script answers Ctrl-C with its own handler (save, sys.exit(7)). One process:
    gpudiag exits 7, as python would; before, 130. Two ranks: the run is interrupted and
    no rank is blamed; before, rank 0's SystemExit was the failure. The ranks deleted
    their working folder, then called collectives: before, a FileNotFoundError raised
    into the script's dist.barrier() from gpudiag's recording of the call site."""
    one, ddp_dir = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    ddp_dir.mkdir()
    single = _trace(one, [])
    wait_for_steps(one / "run", 1, 5, single, JOB_TIMEOUT_S)
    single.send_signal(signal.SIGINT)
    out, err = single.communicate(timeout=120)
    assert single.returncode == 7, err[-3000:]
    assert "SAVED on signal 2" in out
    status = _json(rundir.rank_dir(one / "run", 0) / rundir.STATUS)
    assert status["status"] == "interrupted" and status["exit_code"] == 7, status
    assert "SIGINT handler" in status["message"], status

    ddp = _trace(ddp_dir, ["--nproc-per-node", "2"])
    wait_for_steps(ddp_dir / "run", 2, 12, ddp, JOB_TIMEOUT_S)
    ddp.send_signal(signal.SIGINT)
    _, err = ddp.communicate(timeout=120)
    assert ddp.returncode == 130, err[-3000:]
    manifest = _json(ddp_dir / "run" / "manifest.json")
    assert manifest["status"] == "interrupted" and manifest["failure"] is None, manifest
    for rank in (0, 1):
        status = _json(rundir.rank_dir(ddp_dir / "run", rank) / rundir.STATUS)
        assert (status["status"], status["exc_type"]) == ("interrupted", "KeyboardInterrupt")
    calls = [
        json.loads(line)
        for line in rundir.table_path(rundir.rank_dir(ddp_dir / "run", 1), "collective_times")
        .read_text()
        .splitlines()
    ]
    sites = {c["callsite"] for c in calls if c.get("op") == "barrier"}
    assert sites and all(s.startswith(str(ddp_dir / SCRIPT.name) + ":") for s in sites), sites


@pytest.mark.slow
def test_a_hang_up_ends_the_job_as_interrupted_unless_nohup_ignores_it(tmp_path: Path) -> None:
    """The terminal or ssh session closes: SIGHUP to the launcher. The job runs in a
    session of its own, so before, the launcher died (exit 129) and left the manifest
    `running` with the ranks training on. Now the ranks get SIGTERM and the run ends
    interrupted with 129. Under nohup (SIGHUP ignored) the job runs on."""
    proc = _trace(tmp_path, [])
    wait_for_steps(tmp_path / "run", 1, 5, proc, JOB_TIMEOUT_S)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, err[-3000:]
    manifest = _json(tmp_path / "run" / "manifest.json")
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 129, manifest
    status = _json(rundir.rank_dir(tmp_path / "run", 0) / rundir.STATUS)
    assert (status["status"], status["exc_type"]) == ("interrupted", "SIGTERM"), status

    nohup = tmp_path / "nohup"
    nohup.mkdir()
    proc = _trace(nohup, [], ignore_sighup=True)
    wait_for_steps(nohup / "run", 1, 5, proc, JOB_TIMEOUT_S)
    proc.send_signal(signal.SIGHUP)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err[-3000:]


OBSERVED = """
import os, subprocess, sys, time
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from gpudiag.capture import worker_exit

child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
observer = _ChildProcessObserver(os.getpid(), [child], sleep_period=0.3)
observer.start()
if sys.argv[1] == "stop":
    worker_exit._stop_child_observers()
time.sleep(2.0)
print("ALIVE", flush=True)
"""


@pytest.mark.parametrize("stop", [False, True])
def test_lightnings_child_observer_is_ended_where_python_would_have_exited(stop: bool) -> None:
    """Lightning's observer thread SIGKILLs its own process once a child rank ended
    non-zero. Under plain python it dies with the interpreter when the script ends;
    gpudiag's finishing outlived it and was killed midway (rank 0 of a Lightning job
    interrupted with Ctrl-C lost its trace and final status). Real Lightning class, real
    processes: unstopped it kills (the check is real), stopped it does not."""
    pytest.importorskip("lightning")
    proc = subprocess.run(
        [sys.executable, "-c", OBSERVED, "stop" if stop else "keep"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if stop:
        assert proc.returncode == 0 and "ALIVE" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def test_one_line_named_by_two_paths_is_the_same_line_and_a_different_line_is_not() -> None:
    """Rank 0 of a Lightning job ran `train.py` as given, the rank Lightning re-executed
    ran `/home/u/train.py`; on another node the checkout may lie elsewhere. Before, the
    same broadcast at the same line was reported as a desync (the probe's first finding
    for a Ctrl-C'd Lightning job)."""
    from gpudiag.analysis.mismatch import Call, _odd_ones

    def call(rank: int, site: str) -> Call:
        return Call(rank, "raised", "broadcast", bytes=40, callsite=site)

    same = {0: call(0, "train.py:15 in main"), 1: call(1, "/home/u/train.py:15 in main")}
    assert _odd_ones(same) is None
    other = {0: call(0, "train.py:15 in main"), 1: call(1, "/home/u/train.py:16 in main")}
    assert _odd_ones(other) == ([], "tie")


DELETED_CWD = """
import os, shutil, sys, tempfile
gone = tempfile.mkdtemp()
os.chdir(gone)
from gpudiag import frames
shutil.rmtree(gone)
print(frames.is_user_file("train.py"), frames.absolute("train.py"))
"""


def test_a_deleted_working_folder_never_raises_from_frame_checks(tmp_path: Path) -> None:
    """os.path.realpath of a relative path calls os.getcwd(), which raises once the
    folder is deleted: it reached the script's collective from the call-site record."""
    proc = subprocess.run(
        [sys.executable, "-c", DELETED_CWD], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    user, path = proc.stdout.split()
    assert user == "True" and path.endswith("/train.py") and path.startswith("/"), path


@pytest.mark.slow
def test_a_run_of_one_step_does_not_say_nothing_costs_a_share_of_the_step(tmp_path: Path) -> None:
    """A run interrupted at its first step said "No findings: nothing costs a noticeable
    share of the step" (fourth probe), and a one-step run got a medium dataloader_stall
    from its first batch's 0.45 ms: one step shows neither for sure."""
    single = Path(__file__).parent / "scripts" / "capture_single.py"
    out = tmp_path / "run"
    trace = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
         str(single), "--steps", "1"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert trace.returncode == 0, trace.stderr[-3000:]
    html = tmp_path / "report.html"
    for args in ([], ["--html", str(html)]):
        report = subprocess.run(
            [sys.executable, "-m", "gpudiag", "analyze", str(out), *args],
            capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr[-3000:]
        if not args:
            terminal = report.stdout
    flat = " ".join(terminal.replace("│", " ").split())
    if "No findings" in flat:
        # "profiled" when the one step's window was exported as a trace, else "recorded"
        assert re.search(r"only 1 (profiled|recorded) step was analysed: too few to tell", flat), (
            terminal
        )
        assert "nothing costs" not in flat
        assert "too few to tell where the time goes" in html.read_text()
    else:  # what one step shows is at most low, and says why
        assert "[MEDIUM]" not in flat and "[HIGH]" not in flat, terminal
        assert "from only 1 step: too few to be sure" in flat, terminal
    # the step time is that one step, not a "median over every recorded step after
    # warm-up" (browser probe of issue 31): the HTML and the dashboard say so
    page = html.read_text()
    assert "the one recorded step" in page and "after warm-up" not in page
    result = json.loads(
        subprocess.run(
            [sys.executable, "-m", "gpudiag", "analyze", str(out), "--json"],
            capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=True,
        ).stdout
    )  # fmt: skip
    assert (result["run"]["steady_steps"], result["run"]["warmup_steps"]) == (1, 0)


def test_a_directory_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    """`python pkgdir args` runs pkgdir/__main__.py, and so does torchrun; gpudiag refused
    it as "no such script" (issue 28, seventh probe, F2). A directory without one is a
    one-line usage error that says so."""
    app = tmp_path / "pkgdir"
    app.mkdir()
    (app / "__main__.py").write_text(
        "import sys, torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        # one write: two ranks share the pipe, and print() writes its pieces one by one
        "sys.stdout.write('argv ' + repr(sys.argv[1:]) + chr(10)); sys.stdout.flush()\n"
        "t = torch.ones(4)\n"
        "for _ in range(4):\n"
        "    dist.all_reduce(t)\n"
        "dist.destroy_process_group()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", "run", "--no-lint",
         "--nproc-per-node", "2", "pkgdir", "a b"],
        cwd=tmp_path, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("argv ['a b']") == 2
    assert _json(tmp_path / "run" / "manifest.json")["status"] == "ok"
    (tmp_path / "empty").mkdir()
    refused = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "empty"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "empty: a directory without __main__.py" in refused.stderr


FORKING_SCRIPT = """
import multiprocessing as mp, os, signal, sys, time, torch
def child(q):
    try:
        q.put("started"); time.sleep(30)
    finally:
        print("child finally ran", flush=True)
if __name__ == "__main__":
    m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(6):
        opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()
        if i == 2 and os.fork() == 0:
            m(torch.randn(2, 4)).sum().backward(); opt.step()  # the child steps too
            time.sleep(1.5)  # ends after the rank has written its record
            raise RuntimeError("helper child failed")
    ctx = mp.get_context("fork"); q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,)); p.start(); q.get(timeout=20)
    p.terminate(); p.join(10)
    sys.stdout.write(f"child exitcode {p.exitcode}\\n")
"""


def test_processes_the_script_forks_are_not_the_rank(tmp_path: Path) -> None:
    """Tenth probe of issue 28: a fork-context multiprocessing child kept gpudiag's SIGTERM
    handler (terminate() gave exit 1 and ran its `finally`, where python gives -15), and
    an os.fork child that ran on to the script's end rewrote the rank's status.json and
    summary.json: a healthy run was analysed as failed. A forked child dies of SIGTERM as
    under python, ends with its own code and writes nothing of the rank's record."""
    script = tmp_path / "forks.py"
    script.write_text(FORKING_SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), str(script)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"child exitcode {-signal.SIGTERM}" in proc.stdout
    assert "child finally ran" not in proc.stdout
    assert "_Terminated" not in proc.stderr
    time.sleep(3)  # the os.fork child ends now, after the rank's record was written
    status = _json(out / "rank0" / "status.json")
    assert status["status"] == "ok" and status["steps_completed"] == 6, status
    assert _json(out / "rank0" / "summary.json")["status"] == "ok"
    steps = (out / "rank0" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 6, steps  # the child's step is not the rank's
    report = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out), "--fail-on", "high"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout[-3000:]
    assert "rank_failed" not in report.stdout


def test_a_scripts_own_keyboard_interrupt_prints_its_traceback(tmp_path: Path) -> None:
    """python prints the traceback of an uncaught KeyboardInterrupt (a Ctrl-C, or the
    script's own `raise KeyboardInterrupt`); under gpudiag it was recorded but not printed
    (ninth probe of issue 28). Exit code 130 either way."""
    script = tmp_path / "ki.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "for i in range(5):\n"
        "    m(torch.randn(2, 4)).sum().backward()\n"
        "    if i == 3:\n"
        "        raise KeyboardInterrupt('stop here')\n"
    )
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    traced = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(tmp_path / "run"),
         str(script)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    # python dies of SIGINT (-2 here; 130 in a shell), gpudiag exits 130 (128 + SIGINT)
    assert plain.returncode in (-2, 130) and traced.returncode == 130
    for proc in (plain, traced):
        assert "KeyboardInterrupt: stop here" in proc.stderr
        assert f'File "{script}", line 6' in proc.stderr, proc.stderr[-2000:]
    assert "gpudiag/capture" not in traced.stderr.split("KeyboardInterrupt: stop here")[0]


def test_workers_of_an_in_process_torchrun_are_said_to_be_untraced(tmp_path: Path) -> None:
    """A script that runs torchrun inside itself (`torch.distributed.run.main([...])`, or
    `elastic_launch`) starts workers gpudiag does not trace; the record said nothing of
    them (issue 28, eighth probe). It says so once, on stderr and as a warning of the
    run, and the job runs as under python (the wrapper passes every argument on: torch's
    launch_agent grew keywords)."""
    child = tmp_path / "child.py"
    child.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo'); t = torch.ones(2)\n"
        "for _ in range(3): dist.all_reduce(t)\n"
        "print('child done', dist.get_rank(), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    script = tmp_path / "inproc.py"
    script.write_text(
        "from torch.distributed.run import main\n"
        f"main(['--nproc-per-node', '2', '--standalone', {str(child)!r}])\n"
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), str(script)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("child done") == 2
    assert "they run untraced; trace them with `gpudiag trace --nproc-per-node 2" in proc.stderr
    report = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(out)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert "2 worker(s) with torch's elastic launcher" in report.stderr


def test_rank_variables_left_in_the_shell_are_said(tmp_path: Path) -> None:
    """RANK=3 WORLD_SIZE=8 left over in the shell made a single process that never calls
    init_process_group record as rank 3 of 8 without a word (issue 28, eighth probe).
    The same variables tell separately launched ranks apart, so the rank is kept, and
    the record says that nothing confirmed it."""
    script = tmp_path / "single.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(6):\n"
        "    opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
    )
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), str(script)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = "never called init_process_group: if this was one process on its own"
    assert said in proc.stderr
    assert any(said in line for line in _json(out / "rank3" / "status.json")["incomplete"])


def test_the_launch_folder_does_not_shadow_gpudiags_imports(tmp_path: Path) -> None:
    """`python sub/train.py` does not put the launch folder on sys.path; gpudiag's one
    process did (`python -m`), and a numpy.py there failed the job before the script ran
    (eleventh probe of issue 28, B). A module target (`-m pkg.mod`) still finds the
    working folder's packages, as `python -m` does."""
    (tmp_path / "numpy.py").write_text("raise ImportError('the launch folder shadowed numpy')\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "train.py").write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(6):\n"
        "    opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "print('trained', flush=True)\n"
    )
    (sub / "__init__.py").write_text("")
    for target in (["sub/train.py"], ["-m", "sub.train"]):
        if target[0] == "-m":
            (tmp_path / "numpy.py").unlink()  # python -m puts the folder first too
        out = tmp_path / f"run{len(target)}"
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), *target],
            cwd=tmp_path, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, (target, proc.stderr[-2000:])
        assert "trained" in proc.stdout
        assert _json(out / "rank0" / "status.json")["steps_completed"] == 6


TUTORIAL_RANKS = """
import os, sys, torch, torch.distributed as dist
import torch.multiprocessing as mp
def init_process(rank, size):
    os.environ['MASTER_ADDR'] = '127.0.0.1'; os.environ['MASTER_PORT'] = sys.argv[1]
    dist.init_process_group('gloo', rank=rank, world_size=size)
    t = torch.ones(1); dist.all_reduce(t); dist.destroy_process_group()
if __name__ == "__main__":
    mp.set_start_method("spawn"); ps = []
    for r in range(2):
        p = mp.Process(target=init_process, args=(r, 2)); p.start(); ps.append(p)
    for p in ps: p.join()
"""

LOADER_ONLY = """
import torch
from torch.utils.data import DataLoader, TensorDataset
m = torch.nn.Linear(4, 4)
with torch.no_grad():
    for (x,) in DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, num_workers=2):
        m(x)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ranks_started_with_multiprocessing_process_are_said_to_be_untraced(tmp_path: Path) -> None:
    """The tutorial's shape (`mp.Process(target=init_process, ...)` per rank, spawn start
    method) ran its ranks untraced and the record said "run ok, 1 rank(s), steps [0]"
    (eleventh probe of issue 28, D). When the traced process trained nothing and started
    processes that are not DataLoader / Pool workers, the record says so; an inference
    script with DataLoader workers does not get the note."""
    said = "with multiprocessing and trained nothing in its own process"
    for name, text, args, expect in (
        ("tut.py", TUTORIAL_RANKS, [str(_free_port())], True),
        ("infer.py", LOADER_ONLY, [], False),
    ):
        script = tmp_path / name
        script.write_text(text)
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out",
             str(tmp_path / name.removesuffix(".py")), str(script), *args],
            capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (said in proc.stderr) is expect, (name, proc.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("timeout") is None, reason="GNU timeout not installed")
def test_a_signal_that_timeout_delivers_twice_is_one_request(tmp_path: Path) -> None:
    """Issue 28 probe (class 1): `timeout 120 gpudiag trace ...` stopped with SIGTERM.
    GNU timeout sends the signal to gpudiag and then to its whole process group, so the
    launcher got it twice within microseconds, took the second for "now" and SIGKILLed
    the job: every rank's status lost in 21 of 61 stops. The same signal again within
    a second is one request: the ranks end interrupted, each with its status."""
    run = tmp_path / "run"
    train = Path(__file__).parent / "scripts" / "findings_train.py"
    proc = subprocess.Popen(
        ["timeout", "300", sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2",
         "--standalone", "--no-lint", "--no-profile", "--out", str(run), str(train),
         "--steps", "5000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_steps(run, 2, 5, proc, JOB_TIMEOUT_S)
    proc.send_signal(signal.SIGTERM)  # to timeout, which passes it on twice
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    for rank in (0, 1):
        status = _json(rundir.rank_dir(run, rank) / rundir.STATUS)
        assert status["status"] == "interrupted", (rank, status)
    assert _json(run / "manifest.json")["status"] == "interrupted"


def test_the_same_signal_twice_at_once_is_one_request_and_later_it_kills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher's rule behind the test above, without the race of when Python runs
    the handler (two signals often fold into one call): the same signal again within
    REPEAT_SIGNAL_S is forwarded once and kills nothing; after that a second request
    kills, as a second Ctrl-C does."""
    from gpudiag.capture import launcher

    job = launcher.Job([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    killed: list[bool] = []
    sent: list[int] = []
    monkeypatch.setattr(job, "kill", lambda: killed.append(True))
    monkeypatch.setattr(
        launcher.Job, "_send", staticmethod(lambda pid, signum: sent.append(signum))
    )
    try:
        job.stop(signal.SIGTERM)
        job.stop(signal.SIGTERM)
        assert sent == [signal.SIGTERM] and not killed
        monkeypatch.setattr(launcher, "REPEAT_SIGNAL_S", 0.0)
        job.stop(signal.SIGTERM)
        assert killed == [True]
    finally:
        job.proc.kill()
        job.proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_torchruns_agent_killed_from_outside_is_the_cause_not_a_rank(
    tmp_path: Path, signum: int
) -> None:
    """Issue 28 probe (class 2): SIGKILL to torchrun's agent (the launcher alive). Both
    ranks ended with SIGTERM at its death, and rank 1 was blamed: "ended by SIGTERM from
    outside the job (neither gpudiag, torchrun nor a failing peer sent it)", untrue, and
    the agent not named. The agent's death is the cause; the ranks' ends follow from it.
    Probe 28d: the same for SIGTERM to the agent, which torchrun forwards to every rank
    (an arbitrary rank was blamed, 3 runs of 3)."""
    import psutil

    from gpudiag.analysis import analyze

    run = tmp_path / "run"
    train = Path(__file__).parent / "scripts" / "findings_train.py"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2", "--standalone",
         "--no-lint", "--no-profile", "--out", str(run), str(train), "--steps", "5000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_steps(run, 2, 5, proc, JOB_TIMEOUT_S)
    (agent,) = psutil.Process(proc.pid).children()  # the job: torchrun's agent
    agent.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    manifest = _json(run / "manifest.json")
    assert manifest["status"] == "failed", manifest
    failure = manifest["failure"]
    assert failure["rank"] is None and failure["signal"] == signal.Signals(signum).name, failure
    assert "torchrun's agent" in failure["message"] and "from outside" in failure["message"]
    assert manifest["failed_ranks"] == [], manifest
    first = analyze(run).findings[0]
    assert first.kind == "rank_failed" and "torchrun's agent" in first.title, first.title
    assert "neither gpudiag, torchrun nor a failing peer" not in first.title
