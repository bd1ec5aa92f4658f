"""The capture side never becomes the failure (fast part): writers that cannot raise,
atomic run directories, the launcher's option checks, launcher_lost, parent death.

Real files and processes: /dev/full for a device that is always full, real child
processes for parent death and vanished launchers. The multi-process jobs (a full tmpfs,
SIGKILL of the launcher, concurrent launches) are in test_capture_guard_jobs.py."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.capture import agent, launcher
from gpudiag.cli import trace as trace_cli

# --------------------------------------------------------------------------- writers


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_jsonl_writer_on_a_full_device_never_raises(capsys: pytest.CaptureFixture) -> None:
    writer = rundir.JsonlWriter("/dev/full")
    for i in range(3):  # the first write fails; the rest are ignored
        writer.write({"step": i})
        writer.write_text('{"step":9}\n')
        writer.write_many([{"a": 1}])
    writer.close()
    assert writer.failed and "No space left on device" in writer.failed
    assert any(p.startswith("/dev/full: No space left") for p in rundir.write_problems())
    err = capsys.readouterr().err
    assert err.count("gpudiag: cannot write") <= 1  # said once per process at most


def test_jsonl_writer_that_cannot_open_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = rundir.JsonlWriter(blocker / "sub" / "steps.jsonl")  # parent is a file
    writer.write({"step": 0})
    writer.close()
    assert writer.failed is not None


def test_failed_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        rundir.write_json_atomic(tmp_path / "status.json", {"x": object.__new__(_Unjsonable)})
    assert list(tmp_path.iterdir()) == []


class _Unjsonable:
    def __str__(self) -> str:
        raise TypeError("not serialisable")


def test_exclusive_write_claims_once(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    rundir.write_json_exclusive(path, {"owner": 1})
    with pytest.raises(FileExistsError):
        rundir.write_json_exclusive(path, {"owner": 2})
    assert json.loads(path.read_text()) == {"owner": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def _claim(base: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue):
    barrier.wait()
    out.put(str(rundir.create_unique_dir(base)))


def test_runs_started_in_the_same_second_get_their_own_directory(tmp_path: Path) -> None:
    """Four processes claim the same timestamped name at once."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    base = str(tmp_path / "gpudiag_runs" / "train-20261130-120000")
    procs = [ctx.Process(target=_claim, args=(base, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    names = sorted(Path(out.get(timeout=5)).name for _ in procs)
    assert names == [
        "train-20261130-120000",
        "train-20261130-120000-2",
        "train-20261130-120000-3",
        "train-20261130-120000-4",
    ]


def test_reserve_is_real_data_and_released(tmp_path: Path) -> None:
    path = rundir.reserve_space(tmp_path / rundir.RESERVE, 64 * 1024)
    assert path is not None and path.stat().st_size == 64 * 1024
    assert path.stat().st_blocks * 512 >= 64 * 1024  # allocated, not sparse
    rundir.release_space(path)
    assert not path.exists()
    assert rundir.list_ranks(tmp_path) == []


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sample-hz", "inf"], "--sample-hz inf"),
        (["--sample-hz", "nan"], "--sample-hz nan"),
        (["--sample-hz", "1e-300"], "--sample-hz 1e-300"),
        (["--sample-hz", "0"], "--sample-hz 0"),
        (["--sample-hz", "1e6"], "--sample-hz 1e+06"),
        (["--hang-timeout", "nan"], "--hang-timeout nan"),
        (["--hang-timeout", "-1"], "--hang-timeout -1"),
        (["--nproc-per-node", "abc"], "--nproc-per-node 'abc'"),
        (["--nproc-per-node", "0"], "--nproc-per-node '0'"),
        (["--nproc-per-node", "1.5"], "--nproc-per-node '1.5'"),
        (["--nnodes", "2:1"], "MIN is larger than MAX"),
        (["--nnodes", "x"], "--nnodes 'x'"),
        (["--nnodes", "1:2:3"], "MIN:MAX"),
        (["--node-rank", "-1"], "--node-rank -1"),
        (["--max-restarts", "-2"], "--max-restarts '-2'"),
        (["--master-port", "70000"], "--master-port '70000'"),
        (["--master-port", "http"], "--master-port 'http'"),
        (["--out", ""], "--out: empty value"),
        (["--rdzv-endpoint", " "], "--rdzv-endpoint: empty value"),
    ],
)
def test_bad_option_values_are_one_line_errors_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    with pytest.raises(trace_cli.UsageError, match=message.replace("+", r"\+")):
        trace_cli.parse([*argv, str(script)])
    assert trace_cli.main([*argv, str(script)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err
    assert len(err.strip().splitlines()) == 2  # the error and the usage line
    assert not (tmp_path / "gpudiag_runs").exists()


@pytest.mark.parametrize("value", ["1", "8", "auto", "cpu", "gpu", "xpu"])
def test_nproc_per_node_values_torchrun_takes(value: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    args = trace_cli.parse(["--nproc-per-node", value, "--nnodes", "1:2", str(script)])
    assert args.torchrun_argv[:2] == ["--nproc-per-node", value]


def test_job_that_never_started_a_rank_is_not_every_rank_ok(tmp_path: Path) -> None:
    out = launcher.decide_outcome(tmp_path, 1, None, False, 2)
    assert out["status"] == "failed"
    assert "before any rank started" in out["failure"]["message"]
    assert out["failure"]["rank"] is None


def test_rank_exit_0_without_status_is_ok_but_unwritten(tmp_path: Path) -> None:
    for r in (0, 1):
        rundir.write_rank_json(tmp_path, r, rundir.RANK_INFO, {"rank": r, "world_size": 2})
    rundir.write_rank_json(tmp_path, 0, rundir.STATUS, {"rank": 0, "status": "ok"})
    out = launcher.decide_outcome(tmp_path, 0, None, False, 2)
    assert out["status"] == "ok" and out["exit_code"] == 0
    assert out["unwritten_status_ranks"] == [1] and out["missing_status_ranks"] == [1]
    assert launcher.decide_outcome(tmp_path, 1, None, False, 2)["status"] == "failed"


# --------------------------------------------------------------------------- launcher_lost


def _manifest(pid: int, host: str, start_time: float | None) -> dict:
    return {
        "status": "running",
        "launcher": {"pid": pid, "hostname": host, "start_time": start_time, "heartbeat_s": 5.0},
    }


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_running_run_whose_launcher_is_gone_reads_launcher_lost(tmp_path: Path) -> None:
    rundir.write_json_atomic(
        tmp_path / rundir.MANIFEST, _manifest(_dead_pid(), socket.gethostname(), None)
    )
    run = rundir.load_run(tmp_path)
    assert run.manifest["status"] == "launcher_lost"
    assert run.manifest["recorded_status"] == "running"
    assert any("launcher_lost" in w for w in run.warnings)
    assert rundir.load_summaries(tmp_path)[0]["status"] == "launcher_lost"
    assert "launcher_lost" in rundir.RUN_STATUSES


def test_running_run_with_a_live_launcher_reads_running(tmp_path: Path) -> None:
    import psutil

    me = _manifest(os.getpid(), socket.gethostname(), psutil.Process().create_time())
    rundir.write_json_atomic(tmp_path / rundir.MANIFEST, me)
    assert rundir.load_run(tmp_path).manifest["status"] == "running"
    # the same pid, but a process started at another time: the pid was reused
    me["launcher"]["start_time"] -= 3600
    rundir.write_json_atomic(tmp_path / rundir.MANIFEST, me)
    assert rundir.load_run(tmp_path).manifest["status"] == "launcher_lost"


def test_launcher_on_another_host_judged_by_heartbeat(tmp_path: Path) -> None:
    path = tmp_path / rundir.MANIFEST
    rundir.write_json_atomic(path, _manifest(1, "another-host.invalid", 0.0))
    assert rundir.run_status(json.loads(path.read_text()), path) == "running"
    old = time.time() - 2 * rundir.LAUNCHER_STALE_S
    os.utime(path, (old, old))
    assert rundir.run_status(json.loads(path.read_text()), path) == "launcher_lost"


def test_incomplete_run_is_a_reader_warning(tmp_path: Path) -> None:
    rundir.write_json_atomic(
        tmp_path / rundir.MANIFEST,
        {"status": "ok", "incomplete": ["rank0/steps.jsonl: No space left on device"]},
    )
    run = rundir.load_run(tmp_path)
    assert run.manifest["status"] == "ok"
    assert any("run incomplete: rank0/steps.jsonl" in w for w in run.warnings)


# --------------------------------------------------------------------------- parent death

_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
_CHILD = textwrap.dedent(
    """
    import signal, time
    from gpudiag.capture import agent
    assert agent.die_with_parent(signal.SIGTERM)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    time.sleep(2.0)  # the child imports gpudiag and sets its parent-death signal
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def test_launcher_watch_calls_back_when_the_pid_is_gone() -> None:
    import threading

    lost = threading.Event()
    assert agent.watch_launcher(lost.set, pid=_dead_pid(), poll_s=0.05)
    assert lost.wait(10)
    assert not agent.watch_launcher(lost.set, pid=None) or os.environ.get(agent.ENV_LAUNCHER_PID)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def test_hang_is_handled_when_its_report_cannot_be_written(tmp_path: Path) -> None:
    from gpudiag.capture.watchdog import HangWatchdog

    (tmp_path / rundir.HANG_REPORT).mkdir()  # os.replace onto a non-empty directory fails
    (tmp_path / rundir.HANG_REPORT / "x").write_text("")
    handled = []
    dog = HangWatchdog(tmp_path, 1.0, on_hang=handled.append, finish_ranks=False)
    dog._fire({"verdict": "test"})
    assert handled == [{"verdict": "test"}]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_launcher_pid_no_kernel_gives_reads_as_gone(tmp_path: Path) -> None:
    """Issue 28 probe: a manifest saying `running` with pid 2**70 made `gpudiag watch`
    raise OverflowError in os.kill; such a pid is not a running process."""
    assert not rundir.procs.pid_exists(2**70) and not rundir.procs.pid_exists(-1)
    assert rundir.procs.pid_exists(os.getpid())


def test_a_write_failure_is_named_by_what_the_os_says_not_guessed(tmp_path: Path) -> None:
    """A run directory made unwritable mid-run was reported as "disk full?" / "No space
    left on device" with gigabytes free (eleventh probe of issue 28, C): the reason is
    what the OS says of the folder now; a full disk only when a file can still be made."""
    from gpudiag import rundir

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    assert rundir.why_unwritable(not_a_folder).errno == errno.ENOTDIR
    assert rundir.why_unwritable(tmp_path / "gone").errno == errno.ENOENT
    assert rundir.why_unwritable(tmp_path).errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [not_a_folder]  # the probe file is removed


def test_every_option_trace_documents_is_accepted_before_the_script() -> None:
    """Probe 28g, N3: `--time-buckets` was in `trace --help` and the README but missing
    from the options the command line splits on: "unknown option", exit 2, the job not
    started. Every option of the parser is one the splitter knows, with its value or not."""
    known = {**trace_cli.TORCHRUN_OPTIONS, **trace_cli.GPUDIAG_OPTIONS}
    for action in trace_cli._parser()._actions:
        for flag in action.option_strings:
            assert flag in known, flag
            assert known[flag] == (action.nargs != 0), flag
