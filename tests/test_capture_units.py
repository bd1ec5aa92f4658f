"""Fast in-process tests of the capture pieces: argument splitting, the profiler
window, step detection with real optimizers, and how the launcher decides an outcome."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import torch

from gpudiag import rundir
from gpudiag.analysis.failures import rank_failed_findings
from gpudiag.capture import api, launcher, profiling
from gpudiag.capture.profiling import ProfilerWindow, fix_straddling_optimizer, parse_window
from gpudiag.capture.steps import StepTracker
from gpudiag.capture.worker import Worker
from gpudiag.capture.worker_signals import _Terminated
from gpudiag.cli import trace as trace_cli

# --------------------------------------------------------------------------- argv


def test_split_argv_script_args_untouched() -> None:
    opts, target, rest = trace_cli.split_argv(
        ["--out", "o", "--nproc_per_node=2", "train.py", "--out", "x", "-m", "y"]
    )
    assert opts == ["--out", "o", "--nproc-per-node=2"]
    assert target == {"script": "train.py"}
    assert rest == ["--out", "x", "-m", "y"]


def test_split_argv_module_form() -> None:
    opts, target, rest = trace_cli.split_argv(
        ["--no-profile", "-m", "pkg.train", "--cfg", "a.yaml"]
    )
    assert (opts, target, rest) == (["--no-profile"], {"module": "pkg.train"}, ["--cfg", "a.yaml"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no script given"),
        (["--out"], "--out needs a value"),
        (["--bogus", "x.py"], "unknown option '--bogus'"),
        (["-m"], "-m needs a module name"),
    ],
)
def test_split_argv_errors(argv: list[str], message: str) -> None:
    with pytest.raises(trace_cli.UsageError, match=message):
        trace_cli.split_argv(argv)


def test_usage_error_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert trace_cli.main([str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert f"gpudiag: trace: {tmp_path / 'missing.py'}: no such script" in err
    assert "Traceback" not in err


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_cli.main(["--help"]) == 0
    assert "--profile-steps" in capsys.readouterr().out
    assert trace_cli.main([]) == 2


def test_existing_run_dir_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    rundir.write_json_atomic(rundir.manifest_path(tmp_path / "run"), {"status": "ok"})
    assert trace_cli.main(["--out", str(tmp_path / "run"), str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"gpudiag: trace: {tmp_path / 'run'}: already holds a gpudiag run; choose another --out or remove it"
    )


def test_job_command_single_vs_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    (tmp_path / "p").mkdir()  # -m p.m: its package is there, as python -m would need
    (tmp_path / "p" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    single = launcher.job_command(trace_cli.parse([str(script), "--a"]))
    # -P: the launch folder is not first on sys.path (as for `python script.py`)
    assert single[1:] == ["-P", "-m", "gpudiag.capture.rank", str(script), "--a"]
    multi = launcher.job_command(
        trace_cli.parse(["--nproc-per-node", "4", "--rdzv-endpoint", "h:1", "-m", "p.m", "--a"])
    )
    assert multi[1:3] == ["-m", "gpudiag.capture.agent"]  # torch.distributed.run, wrapped
    assert multi[3:] == [
        "--nproc-per-node",
        "4",
        "--rdzv-endpoint",
        "h:1",
        "-m",
        "gpudiag.capture.rank",
        "-m",
        "p.m",
        "--a",
    ]


def test_parse_window() -> None:
    assert parse_window("5-9") == (5, 9)
    assert parse_window("7") == (7, 7)
    for bad in ("9-5", "a-b", "-1"):
        with pytest.raises(ValueError, match="--profile-steps"):
            parse_window(bad)


# --------------------------------------------------------------------------- outcome


def _status(run: Path, rank: int, status: str, code: int, end_ns: int, world: int = 2) -> None:
    rundir.write_rank_json(
        run, rank, rundir.RANK_INFO, {"rank": rank, "world_size": world, "backend": "gloo"}
    )
    rundir.write_rank_json(
        run,
        rank,
        rundir.STATUS,
        {
            "rank": rank,
            "status": status,
            "exit_code": code,
            "exc_type": "RuntimeError",
            "message": f"m{rank}",
            "traceback": "tb",
            "steps_completed": 3,
            "end_ns": end_ns,
        },
    )


def test_outcome_earliest_failure_is_the_root_cause(tmp_path: Path) -> None:
    _status(tmp_path, 0, "failed", 1, end_ns=200)
    _status(tmp_path, 1, "failed", 7, end_ns=100)
    out = launcher.decide_outcome(tmp_path, 1, None, False, 2)
    assert out["status"] == "failed" and out["failed_ranks"] == [1, 0]
    assert out["failure"]["rank"] == 1 and out["exit_code"] == 7
    assert out["backend"] == "gloo" and out["world_size"] == 2


def test_outcome_rank_without_status_is_failed(tmp_path: Path) -> None:
    _status(tmp_path, 0, "ok", 0, end_ns=100)
    rundir.write_rank_json(tmp_path, 1, rundir.RANK_INFO, {"rank": 1, "world_size": 2})
    out = launcher.decide_outcome(tmp_path, -9, None, False, 2)
    assert out["status"] == "failed" and out["failed_ranks"] == [1]
    assert "rank(s) [1] ended without writing status.json" in out["failure"]["message"]
    assert out["exit_code"] == 137


def test_outcome_rank_of_another_launcher_is_not_a_full_disk(tmp_path: Path) -> None:
    """Issue 28: a script started once per rank, each with its own `gpudiag trace`
    (world of 2, rank 0 here): rank 1 left nothing here, which is no disk problem."""
    _status(tmp_path, 0, "ok", 0, end_ns=100)
    out = launcher.decide_outcome(tmp_path, 0, None, False, None, single_process=True)
    assert out["status"] == "ok" and out["unwritten_status_ranks"] == []
    assert out["ranks_elsewhere"] == [1] and out["missing_status_ranks"] == []
    reasons = launcher._incomplete_reasons(tmp_path, out, [])
    assert len(reasons) == 1 and "another launcher" in reasons[0] and "disk" not in reasons[0]


def test_outcome_crash_plus_rank_without_status_lists_both(tmp_path: Path) -> None:
    # rank 1 raised; rank 0 was aborted by gloo's own thread before it could write status.json
    _status(tmp_path, 1, "failed", 1, end_ns=100)
    rundir.write_rank_json(tmp_path, 0, rundir.RANK_INFO, {"rank": 0, "world_size": 2})
    out = launcher.decide_outcome(tmp_path, 1, None, False, 2)
    assert out["status"] == "failed" and out["failed_ranks"] == [1, 0]
    assert out["failure"]["rank"] == 1 and out["missing_status_ranks"] == [0]


def test_outcome_all_ok_but_job_aborted_is_failed(tmp_path: Path) -> None:
    _status(tmp_path, 0, "ok", 0, end_ns=100)
    _status(tmp_path, 1, "ok", 0, end_ns=100)
    out = launcher.decide_outcome(tmp_path, -6, None, False, 2)
    assert out["status"] == "failed" and out["exit_code"] == 134
    assert "every rank reported ok" in out["failure"]["message"]


def test_outcome_interrupt_and_hang(tmp_path: Path) -> None:
    _status(tmp_path, 0, "interrupted", 143, end_ns=100)
    _status(tmp_path, 1, "interrupted", 143, end_ns=100)
    assert launcher.decide_outcome(tmp_path, 1, 15, False, 2)["exit_code"] == 143
    assert launcher.decide_outcome(tmp_path, 1, 2, False, 2)["status"] == "interrupted"
    hang = launcher.decide_outcome(tmp_path, 1, None, True, 2)
    assert hang["status"] == "hang" and hang["exit_code"] == 1


# The real error rank 0 got (gloo, torch 2.13) when the watchdog ended rank 1, which it
# was waiting for in all_reduce (recorded with tests/scripts/findings_hang.py).
GLOO_PEER_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:38792. This is typically caused by a remote worker crashing."
)


def _peer_closed(run: Path, rank: int, end_ns: int) -> None:
    _status(run, rank, "failed", 1, end_ns=end_ns)
    status = json.loads((run / f"rank{rank}" / "status.json").read_text())
    status["message"] = GLOO_PEER_CLOSED
    rundir.write_rank_json(run, rank, rundir.STATUS, status)


def test_outcome_of_a_hang_does_not_blame_the_rank_whose_peer_the_watchdog_ended(
    tmp_path: Path,
) -> None:
    """Regression: the watchdog ended rank 1 (status hang); rank 0's all_reduce then
    raised "Connection closed by peer" before its own finish request was handled. The
    manifest said failed_ranks [0] with rank 0's error as the failure, and analyze put a
    rank_failed finding for rank 0 before the hang."""
    _peer_closed(tmp_path, 0, end_ns=200)
    _status(tmp_path, 1, "hang", 1, end_ns=100)
    out = launcher.decide_outcome(tmp_path, 1, None, True, 2)
    assert out["status"] == "hang" and out["failed_ranks"] == [] and out["failure"] is None
    # the same statuses without a hang: rank 0's error is then a failure to report
    assert launcher.decide_outcome(tmp_path, 1, None, False, 2)["failed_ranks"] == [0]


def test_hang_run_has_no_rank_failed_finding_for_a_peer_error() -> None:
    manifest = {
        "status": "hang",
        "failed_ranks": [0],  # as written before the fix
        "failure": {"rank": 0, "exc_type": "RuntimeError", "message": GLOO_PEER_CLOSED},
    }
    statuses = {
        0: {"status": "failed", "exc_type": "RuntimeError", "message": GLOO_PEER_CLOSED},
        1: {"status": "hang", "exc_type": "Hang", "message": "ended by gpudiag's hang watchdog"},
    }
    assert rank_failed_findings(manifest, statuses) == []
    # a rank that failed by itself during a hang is still reported
    statuses[0] = {"status": "failed", "exc_type": "ValueError", "message": "bad batch"}
    (finding,) = rank_failed_findings(manifest | {"failure": None}, statuses)
    assert finding.ranks == [0] and "bad batch" in finding.title


def test_worker_outcome_after_the_watchdog_decided_is_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    worker = Worker(tmp_path, {"script": "train.py"}, [])
    peer_closed = RuntimeError(GLOO_PEER_CLOSED)
    assert worker._outcome_of(peer_closed).status == "failed"  # no hang decided: a failure
    verdict = "rank 1 never entered all_reduce seq 4 (pg 0) that rank 0 is waiting in"
    rundir.write_json_atomic(tmp_path / rundir.HANG_REPORT, {"verdict": verdict})
    outcome = worker._outcome_of(peer_closed)
    assert outcome.status == "hang" and outcome.exc_type == "Hang"
    assert verdict in (outcome.message or "") and "Connection closed by peer" in (
        outcome.message or ""
    )
    # the agent's SIGTERM, sent because the watchdog's exit of rank 1 ended the worker group
    assert worker._outcome_of(_Terminated()).status == "hang"
    # an error of the rank's own is never turned into the hang
    assert worker._outcome_of(ValueError("bad batch")).status == "failed"


# --------------------------------------------------------------------------- steps in-process


@pytest.fixture
def tracker(tmp_path: Path):
    t = StepTracker(tmp_path, 0)
    t.install()
    api.install(t)
    yield t
    api.install(None)
    t.uninstall()
    t.close()


def _train(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], steps: int) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(steps * 2, 4), torch.randn(steps * 2, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=2):
        for opt in optimizers:
            opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for opt in optimizers:
            opt.step()


def test_two_optimizers_count_each_step_once(tracker: StepTracker, tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.Adam(model[1].parameters())]
    _train(model, opts, steps=5)
    tracker.close()
    rows = list(rundir.iter_jsonl(rundir.table_path(rundir.rank_dir(tmp_path, 0), rundir.STEPS)))
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r["data_ns"] > 0 and r["optimizer_ns"] > 0 for r in rows)
    assert all(a["end_ns"] == b["start_ns"] for a, b in zip(rows, rows[1:], strict=False))


def test_api_step_switches_source_and_regions(tracker: StepTracker, tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    _train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=2)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError), api.region("boom"):
            1 / 0  # noqa: B018
        api.step()
    _train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=1)  # not a boundary now
    tracker.close()
    rows = list(rundir.iter_jsonl(rundir.table_path(rundir.rank_dir(tmp_path, 0), rundir.STEPS)))
    assert [r["source"] for r in rows] == ["optimizer", "optimizer", "api", "api"]
    regions = list(
        rundir.iter_jsonl(rundir.table_path(rundir.rank_dir(tmp_path, 0), rundir.REGIONS))
    )
    assert [(r["name"], r["step"]) for r in regions] == [("boom", 2), ("boom", 3)]


def test_gpudiag_api_is_a_noop_outside_trace() -> None:
    import gpudiag

    api.install(None)
    gpudiag.step()
    with gpudiag.region("x"):
        pass


def test_profiler_window_in_process(tracker: StepTracker, tmp_path: Path) -> None:
    window = ProfilerWindow(tmp_path, 0, 1, (2, 3), provisional=False)
    tracker.profiler = window
    model = torch.nn.Linear(4, 1)
    _train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=6)
    assert window.done and window.profiled_steps == [2, 3]
    with gzip.open(rundir.trace_path(tmp_path, 0)) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    marks = sorted(
        (e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    assert [m["name"] for m in marks] == ["ProfilerStep#2", "ProfilerStep#3"]
    # the fix-up already ran: nothing left to move, and each optimizer event is inside a step
    assert fix_straddling_optimizer(events) == 0
    optimizers = [e for e in events if e["name"].startswith("Optimizer.step#")]
    assert len(optimizers) == 2
    for opt, mark in zip(sorted(optimizers, key=lambda e: e["ts"]), marks, strict=True):
        assert mark["ts"] <= opt["ts"] and opt["ts"] + opt["dur"] <= mark["ts"] + mark["dur"] + 0.01


def _regioned_train(model: torch.nn.Module, steps: int) -> None:
    """Every step inside ``gpudiag.region``: the window's stop and start points (the first
    forward of a step) fall inside an open user range."""
    import gpudiag

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    for _ in range(steps):
        with gpudiag.region("step"):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


def _count_profiler_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    starts: list[int] = []
    original = torch.profiler.profile.start

    def start(self: torch.profiler.profile) -> None:
        starts.append(1)
        original(self)

    monkeypatch.setattr(torch.profiler.profile, "start", start)
    return starts


def _trace_events(run: Path) -> list[dict]:
    with gzip.open(rundir.trace_path(run, 0)) as fh:
        return json.load(fh)["traceEvents"]


def test_default_window_is_one_profiler_session_cut_at_its_first_step(
    tracker: StepTracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range begun under one torch profiler and ended under another writes into the
    first one's freed memory (SIGSEGV under gpudiag.region, issue 28): the default window
    never starts a second profiler, and warm-up is cut from the trace instead."""
    starts = _count_profiler_starts(monkeypatch)
    window = ProfilerWindow(tmp_path, 0, 1, (5, 9), provisional=True)
    tracker.profiler = window
    _regioned_train(torch.nn.Linear(4, 1), steps=14)
    assert starts == [1]
    assert window.done and window.profiled_steps == [5, 6, 7, 8, 9]
    events = _trace_events(tmp_path)
    marks = sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )
    assert [m["name"] for m in marks] == [f"ProfilerStep#{k}" for k in range(5, 10)]
    first = marks[0]["ts"]
    timed = [e for e in events if e.get("ph") not in ("M",) and "ts" in e]
    assert timed and all(e["ts"] >= first for e in timed)
    regions = [e for e in events if e.get("name") == "step"]
    assert 4 <= len(regions) <= 6  # the regions of steps 5-9, cut where the window stops
    span = [e for e in events if e.get("cat") == "Trace"]
    assert len(span) == 1 and span[0]["ts"] == first


def test_short_run_keeps_its_early_steps_in_one_session(
    tracker: StepTracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = _count_profiler_starts(monkeypatch)
    window = ProfilerWindow(tmp_path, 0, 1, (5, 9), provisional=True)
    tracker.profiler = window
    _regioned_train(torch.nn.Linear(4, 1), steps=3)
    window.finish()
    assert starts == [1] and window.profiled_steps == [0, 1, 2]
    names = {e.get("name") for e in _trace_events(tmp_path)}
    assert {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"} <= names


def test_window_gives_way_to_a_profiler_the_script_creates(
    tracker: StepTracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two profilers in one process corrupt each other (module doc): a script's own
    torch.profiler, created while gpudiag's window is open, ends that window untraced."""
    starts = _count_profiler_starts(monkeypatch)
    window = ProfilerWindow(tmp_path, 0, 1, (5, 9), provisional=True)
    tracker.profiler = window
    profiling.watch_for_script_profilers(window)
    try:
        _regioned_train(torch.nn.Linear(4, 1), steps=2)
        assert window.active
        torch.profiler.profile()  # the script's own, never started
        assert not window.active and window.done and "its own" in (window.export_error or "")
        _regioned_train(torch.nn.Linear(4, 1), steps=10)
    finally:
        profiling._WINDOWS.clear()
    assert starts == [1] and not rundir.trace_path(tmp_path, 0).exists()


def test_cut_drops_flows_whose_other_end_was_cut() -> None:
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0.0, "dur": 100.0},
            {"ph": "X", "name": "ProfilerStep#4", "ts": 1.0, "dur": 9.0},
            {"ph": "s", "cat": "fwdbwd", "id": 7, "ts": 9.0},
            {"ph": "X", "name": "ProfilerStep#5", "ts": 10.0, "dur": 10.0},
            {"ph": "f", "cat": "fwdbwd", "id": 7, "ts": 12.0},
            {"ph": "s", "cat": "fwdbwd", "id": 8, "ts": 13.0},
            {"ph": "f", "cat": "fwdbwd", "id": 8, "ts": 14.0},
        ]
    }
    assert profiling.cut_events_before_step(trace, 5) == 3
    kept = trace["traceEvents"]
    assert [e.get("name") or (e["ph"], e["id"]) for e in kept] == [
        "process_name", "PyTorch Profiler (0)", "ProfilerStep#5", ("s", 8), ("f", 8)
    ]  # fmt: skip
    assert kept[1]["ts"] == 10.0 and kept[1]["dur"] == 90.0
    assert profiling.cut_events_before_step(trace, 3) == 0  # no such step: nothing cut


def test_step_hot_path_is_cheap(tracker: StepTracker) -> None:
    """Not a timing assertion on the run, just that a boundary is microseconds, not ms."""
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        api.step()
    per_step_us = (time.perf_counter() - t0) / n * 1e6
    assert per_step_us < 500, per_step_us


def test_straddle_fix_is_idempotent_after_rounding() -> None:
    """A boundary moved to an optimizer end that rounding cannot represent exactly must not
    count as straddling again (the profiler-window test failed 1 run in 5 on this)."""
    step = {"ph": "X", "name": "ProfilerStep#2", "ts": 0.1, "dur": 1.0, "tid": 1}
    following = {"ph": "X", "name": "ProfilerStep#3", "ts": 1.1, "dur": 2.0, "tid": 1}
    optimizer = {
        "ph": "X",
        "name": "Optimizer.step#SGD.step",
        "ts": 0.9,
        "dur": 0.2500004,
        "tid": 1,
    }
    events = [step, following, optimizer]
    assert fix_straddling_optimizer(events) == 1
    assert fix_straddling_optimizer(events) == 0
    assert abs(step["ts"] + step["dur"] - (optimizer["ts"] + optimizer["dur"])) <= 0.001


def test_outcome_blames_the_rank_killed_without_status_not_its_peer(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed (no status.json; the agent saw -9); rank 0 then raised "Connection
    closed by peer": rank 1 is the cause, rank 0 a consequence."""
    _status(tmp_path, 0, "failed", 1, end_ns=300)
    status0 = json.loads((tmp_path / "rank0" / "status.json").read_text())
    status0["message"] = "[pair.cc:553] Connection closed by peer [127.0.0.1]:3230"
    rundir.write_rank_json(tmp_path, 0, rundir.STATUS, status0)
    rundir.write_rank_json(tmp_path, 1, rundir.RANK_INFO, {"rank": 1, "world_size": 2})
    failures = {"1": {"rank": 1, "exitcode": -9}, "0": {"rank": 0, "exitcode": 1}}
    rundir.write_json_atomic(
        rundir.node_dir(tmp_path, 0) / "agent_failures.json", {"failures": failures}
    )
    out = launcher.decide_outcome(tmp_path, 1, None, False, 2)
    assert out["status"] == "failed" and out["failed_ranks"] == [1, 0]
    failure = out["failure"]
    assert failure["rank"] == 1 and failure["signal"] == "SIGKILL"
    assert [c["rank"] for c in failure["consequences"]] == [0]
    assert "consequence" in failure["message"] and out["exit_code"] == 137


def test_a_keyboard_interrupt_nobody_in_the_job_sent_may_be_the_scripts_own(
    tmp_path: Path,
) -> None:
    """Rank 1 ends with KeyboardInterrupt (130) while the launcher got no signal: a
    `kill -INT` from outside, or the script's own `raise KeyboardInterrupt` (the third
    probe's case, which was called "SIGINT from outside the job"). The cause says both."""
    _status(tmp_path, 1, "interrupted", 130, end_ns=100)
    _peer_closed(tmp_path, 0, end_ns=200)
    failure = launcher.decide_outcome(tmp_path, 1, None, False, 2)["failure"]
    assert failure["rank"] == 1 and failure["signal"] == "SIGINT"
    assert "KeyboardInterrupt" in failure["message"], failure["message"]
    assert "raised by the script itself" in failure["message"]
    assert "consequence" in failure["message"]


def test_outcome_blames_the_rank_signalled_from_outside_not_its_peer(tmp_path: Path) -> None:
    """Issue 28: `kill -TERM` to rank 1 alone (the launcher got no signal): rank 1 ends
    ``interrupted``, rank 0 then raises "Connection closed by peer". Rank 1 is the cause;
    when the launcher itself was signalled, nobody is blamed for the interrupt."""
    _status(tmp_path, 1, "interrupted", 143, end_ns=100)
    _peer_closed(tmp_path, 0, end_ns=200)
    out = launcher.decide_outcome(tmp_path, 1, None, False, 2)
    failure = out["failure"]
    assert out["status"] == "failed" and out["failed_ranks"][0] == 1
    assert failure["rank"] == 1 and failure["signal"] == "SIGTERM"
    assert "from outside the job" in failure["message"] and "consequence" in failure["message"]
    assert [c["rank"] for c in failure["consequences"]] == [0]
    finding = rank_failed_findings(out, {})[0]
    assert finding.ranks == [1] and "outside the job" in finding.title
    # the agent's SIGTERM after a peer's own error: the peer stays the cause
    _status(tmp_path, 0, "failed", 1, end_ns=50)
    assert launcher.decide_outcome(tmp_path, 1, None, False, 2)["failure"]["rank"] == 0
    # Ctrl-C to gpudiag: everyone interrupted, nobody blamed
    _status(tmp_path, 0, "interrupted", 143, end_ns=100)
    interrupted = launcher.decide_outcome(tmp_path, 1, 15, False, 2)
    assert interrupted["status"] == "interrupted" and interrupted["failure"] is None


def test_outcome_single_process_killed_by_a_signal(tmp_path: Path) -> None:
    rundir.write_rank_json(tmp_path, 0, rundir.RANK_INFO, {"rank": 0, "world_size": 1})
    out = launcher.decide_outcome(tmp_path, -11, None, False, 1, single_process=True)
    assert out["failure"]["rank"] == 0 and out["failure"]["signal"] == "SIGSEGV"
    assert out["exit_code"] == 139


def test_watchdog_activity_and_hang_rule() -> None:
    from gpudiag.capture.watchdog import Usage, activity, is_hang

    assert activity(Usage(0.0, 1.0, 0), Usage(3.0, 1.01, 0)) == "idle"
    assert activity(Usage(0.0, 1.0, 0), Usage(3.0, 1.3, 0)) == "working"
    assert activity(Usage(0.0, 1.0, 0), Usage(3.0, 1.0, 5 << 20)) == "working"  # I/O
    assert activity(Usage(0.0, 1.0, 0), Usage(3.0, 0.0, 0, alive=False)) == "gone"

    def st(a: str) -> dict:
        return {"activity": a, "top_frame": None}

    assert is_hang({0: st("waiting"), 1: st("idle")})[0]
    assert is_hang({0: st("waiting"), 1: st("gone")})[0]
    assert is_hang({0: st("waiting"), 1: st("waiting")})[0]
    assert not is_hang({0: st("waiting"), 1: st("working")})[0]  # never kill working ranks
    assert not is_hang({0: st("working"), 1: st("idle")})[0]  # nobody waits: not a hang
    assert not is_hang({0: st("waiting")}, starting=1)[0]  # a rank still starting


@pytest.mark.parametrize(
    ("mode", "activities", "world", "ends"),
    [
        ("auto", ["waiting", "idle"], 2, False),  # asleep, maybe on purpose (probe 28f)
        ("auto", ["waiting", "waiting"], 2, True),  # in different calls: a deadlock
        ("auto", ["waiting", "gone"], 2, True),  # the peer will never arrive
        ("auto", ["waiting", "waiting"], 4, False),  # two ranks of another node unseen
        ("end", ["waiting", "idle"], 2, True),
        ("report", ["waiting", "waiting"], 2, False),
    ],
)
def test_which_hangs_end_the_job(
    tmp_path: Path, mode: str, activities: list[str], world: int, ends: bool
) -> None:
    """`--on-hang`: auto ends the job only when nothing but the hang explains it."""
    from gpudiag.capture.watchdog import HangWatchdog

    for rank in range(len(activities)):
        rundir.rank_dir(tmp_path, rank).mkdir(parents=True)
        info = {"rank": rank, "world_size": world, "pid": 1}
        (rundir.rank_dir(tmp_path, rank) / rundir.RANK_INFO).write_text(json.dumps(info))
    report = {
        "ranks": {
            str(r): {"activity": a, "inflight": [{"pg_name": "0", "seq": 5 + r, "op": "x"}]}
            for r, a in enumerate(activities)
        }
    }
    watchdog = HangWatchdog(tmp_path, 5.0, on_hang_mode=mode)
    assert watchdog._ends_the_job(report) is ends
    if not ends and mode == "auto":
        assert watchdog._why_not_ended(report)
    # probe 28g, N2: every rank inside the same call is a stuck transport or a long,
    # healthy transfer: auto leaves it running (a desync between them is certain)
    for state in report["ranks"].values():
        state["inflight"] = [{"pg_name": "0", "seq": 5, "op": "all_reduce"}]
    if mode == "auto" and activities == ["waiting", "waiting"] and world == 2:
        assert not watchdog._ends_the_job(report)
        assert "the same collective (all_reduce seq 5 (pg 0))" in watchdog._why_not_ended(report)
        report["desync"] = {"pg_name": "0", "seq": 5}
        assert watchdog._ends_the_job(report)


@pytest.mark.parametrize(
    ("line", "profiles"),
    [
        ("from torch.profiler import profile, schedule", True),
        ("with torch.profiler.profile() as p:", True),
        ("with torch.autograd.profiler.profile() as p:", True),
        ("from torch.profiler import ProfilerActivity, profile", True),
        ("from torch.profiler import record_function", False),
        ("with torch.profiler.record_function('step'):", False),
        ("from torch.autograd.profiler import record_function", False),
        ("from torch.profiler import (\n    ProfilerActivity,\n    profile,\n)", True),
        ("from torch.profiler import (\n    record_function,\n)", False),
        # the module under another name (ninth probe: missed, the job then crashed)
        ("from torch import profiler as P\nprof = P.profile(activities=[])", True),
        ("import torch.profiler as tp\nprof = tp.profile()", True),
        ("import torch.autograd.profiler as ap\nwith ap.profile() as p: pass", True),
        ("from torch import nn, profiler as pr\nwith pr.profile(): pass", True),
        ("from torch import profiler as P\nwith P.record_function('x'): pass", False),
    ],
)
def test_a_script_that_creates_its_own_profiler_is_told_apart(
    tmp_path: Path, line: str, profiles: bool
) -> None:
    """Issue 28, second probe: a script starting its own profiler inside gpudiag's window
    aborted; such a script keeps its profiler and gpudiag's window is skipped."""
    from gpudiag.capture.script_run import _profiles_itself

    script = tmp_path / "train.py"
    script.write_text(f"import torch\n{line}\n")
    assert _profiles_itself({"script": str(script)}) is profiles


@pytest.mark.parametrize(
    ("files", "profiles"),
    [
        ({"train.py": "import helpers\n", "helpers.py": "import torch.profiler as tp\ntp.profile()"}, True),
        ({"train.py": "from utils.prof import start\n", "utils/__init__.py": "",
          "utils/prof.py": "from .deep import go\n", "utils/deep.py": "from torch.profiler import profile\n"}, True),
        ({"train.py": "import helpers, torch\n", "helpers.py": "from torch.profiler import record_function\n"}, False),
        ({"train.py": "import numpy\n"}, False),  # not a file of the script's folder
        ({"train.py": "import a\n", "a.py": "import b\n", "b.py": "import a\n"}, False),  # a circle
    ],
    ids=["sibling", "package-relative", "ranges-only", "third-party", "circle"],
)  # fmt: skip
def test_a_profiler_created_by_a_module_of_the_scripts_folder_is_seen(
    tmp_path: Path, files: dict[str, str], profiles: bool
) -> None:
    """Probe 28d, defect 9: a helper module the script imports created the profiler at
    step 7 inside an open range (3 of 6 traced runs crashed); only the script was read."""
    from gpudiag.capture.script_run import _profiles_itself

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _profiles_itself({"script": str(tmp_path / "train.py")}) is profiles


def test_a_rank_interrupted_after_a_peer_failed_is_not_blamed_as_signalled_from_outside() -> None:
    """Seen under load on a 2-node job whose node 1 launcher was SIGKILLed: node 0's
    rank 0 failed with a peer's connection error, then node 0's torchrun ended rank 1
    (SIGTERM). Rank 1 was blamed as "ended from outside the job"; the ranks of the lost
    node are the cause. A rank interrupted before anyone failed still is."""
    from gpudiag.capture import blame

    def ends(interrupted_at: int) -> dict[int, blame.RankEnd]:
        peer_error = {
            "status": "failed",
            "end_ns": 1_000,
            "exc_type": "DistStoreError",
            "message": "Connection closed by peer",
        }
        return {
            0: blame.RankEnd(0, status=peer_error),
            1: blame.RankEnd(1, status={"status": "interrupted", "end_ns": interrupted_at}),
            2: blame.RankEnd(2, lost="node 1's launcher gone", last_write_ns=900),
        }

    assert blame.is_peer_error(ends(0)[0].status or {})
    after = blame.find_cause(ends(2_000), signalled_from_outside=True)
    assert after is not None and after[0] == 2
    before = blame.find_cause(ends(500), signalled_from_outside=True)
    assert before is not None and before[0] == 1


class _CorruptSample(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        raise IndexError(f"corrupt sample {i}")


def test_a_loader_workers_error_keeps_its_own_message() -> None:
    """A DataLoader worker's error reaches the script as "Caught IndexError in DataLoader
    worker process 0." with the worker's traceback below: the recorded message was that
    line alone, without the error (seventh probe). It now ends with the error's own line."""
    from gpudiag.capture.worker_outcome import _first_line

    loader = torch.utils.data.DataLoader(_CorruptSample(), batch_size=2, num_workers=1)
    with pytest.raises(IndexError) as caught:
        next(iter(loader))
    line = _first_line(caught.value, "IndexError")
    assert line.startswith("Caught IndexError in DataLoader worker process 0")
    assert line.endswith("IndexError: corrupt sample 0"), line
    assert _first_line(ValueError("one\ntwo"), "ValueError") == "one"


def test_an_error_that_opens_with_a_rule_is_recorded_by_its_first_words() -> None:
    """A script that runs torchrun's agent itself (`torch.distributed.run.main([...])`)
    fails with a ChildFailedError whose text opens with a blank line and a rule of '=':
    the record's message was empty and the finding's title "Rank 0 failed: ====="
    (eighth probe, F4). The first line that says something is recorded."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from gpudiag.capture.worker_outcome import _first_line

    failure = ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file="/nonexistent")
    error = ChildFailedError("train.py", {1: failure})
    assert str(error).startswith("\n====")
    assert _first_line(error, "ChildFailedError") == "train.py FAILED"


def test_a_nodes_record_names_only_its_own_ranks_incomplete(tmp_path: Path) -> None:
    """Probe 28d, defect 3: in a shared --out, node 1's launcher (ranks 2 and 3) read node
    0's ranks still finishing and wrote "rank 0: the rank ended while gpudiag was writing
    its record" into its own manifest; `analyze` repeated it of node 0's healthy ranks."""
    from gpudiag.capture.launch_outcome import _incomplete_reasons

    for rank in range(4):
        rdir = rundir.rank_dir(tmp_path, rank)
        rdir.mkdir(parents=True)
        status = {"rank": rank, "status": "ok", "finishing": True}
        status["incomplete"] = [rundir.ENDED_WHILE_FINISHING] if rank in (0, 3) else None
        (rdir / rundir.STATUS).write_text(json.dumps(status))
    reasons = _incomplete_reasons(tmp_path, {"traced_ranks": [2, 3]}, [])
    assert reasons == [f"rank 3: {rundir.ENDED_WHILE_FINISHING}"], reasons
    every = _incomplete_reasons(tmp_path, {}, [])  # one node: every rank is its own
    assert [r.split(":")[0] for r in every] == ["rank 0", "rank 3"], every
