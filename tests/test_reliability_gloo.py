"""Reliability of `gpudiag trace` on real gloo jobs (docs/reliability.md): a healthy job
is never ended as hung, a hang before the first step is caught, the rank that died
first is blamed, and scripts that spawn their own workers are traced.

Every job is an unmodified script (tests/scripts/rel_job.py, spawn_ddp.py) run through
`gpudiag trace`, as a user would. Short hang timeouts on purpose: the machine these run
on is loaded, and the watchdog must tell a slow rank from a stuck one there too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

from gpudiag import rundir  # noqa: E402
from gpudiag.analysis import analyze  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
JOB = SCRIPTS / "rel_job.py"
SPAWN = SCRIPTS / "spawn_ddp.py"


def _trace(
    out: Path,
    script: Path,
    args: list[str],
    nproc: int = 2,
    hang_timeout: float = 3,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-profile",
        "--no-lint", "--hang-timeout", str(hang_timeout), "--on-hang", "end",
    ]  # fmt: skip
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc), "--master-port", str(coll_launch.free_port())]
    env = dict(os.environ, SPAWN_TEST_PORT=str(coll_launch.free_port()), **(env_extra or {}))
    return subprocess.run(
        [*cmd, str(script), *args], capture_output=True, text=True, timeout=400, env=env
    )


def _line(script: Path, text: str) -> int:
    return next(i for i, t in enumerate(script.read_text().splitlines(), 1) if text in t)


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _status(out: Path, rank: int) -> dict:
    return json.loads((rundir.rank_dir(out, rank) / rundir.STATUS).read_text())


# ----------------------------------------------------------------- never kill working ranks


def test_python_only_phase_longer_than_the_timeout_is_not_a_hang(tmp_path: Path) -> None:
    """8 s of evaluation-like Python on every rank under --hang-timeout 3."""
    proc = _trace(tmp_path / "run", JOB, ["eval", "6", "3"])
    assert proc.returncode == 0, proc.stderr
    m = _manifest(tmp_path / "run")
    assert m["status"] == "ok" and m["steps_completed"] == {"0": 6, "1": 6}
    assert not (tmp_path / "run" / rundir.HANG_REPORT).exists()


def test_rank_working_while_its_peer_waits_is_not_a_hang(tmp_path: Path) -> None:
    """Rank 0 checkpoints for 8 s while rank 1 waits in a barrier: said once, not ended."""
    proc = _trace(tmp_path / "run", JOB, ["checkpoint", "6", "3"])
    assert proc.returncode == 0, proc.stderr
    assert _manifest(tmp_path / "run")["status"] == "ok"
    assert "rank 0 still working" in proc.stderr
    assert not (tmp_path / "run" / rundir.HANG_REPORT).exists()


# ----------------------------------------------------------------- hangs before the first step


def test_hang_in_the_rendezvous_is_caught_and_ranks_flush(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _trace(out, JOB, ["rendezvous"])
    m = _manifest(out)
    assert m["status"] == "hang", proc.stderr
    report = json.loads((out / rundir.HANG_REPORT).read_text())
    assert report["hang"] and report["stuck_ranks"] == [0]
    assert report["ranks"]["0"]["distributed_call"] == "init_process_group"
    assert "never reached" in report["verdict"]
    frame = report["ranks"]["1"]["top_frame"]
    assert frame.startswith(f"{JOB}:{_line(JOB, 'never joins the rendezvous')} ")
    # both ranks wrote their status before the job ended (the poller thread finished them)
    for rank in (0, 1):
        assert _status(out, rank)["status"] == "hang"
    finding = analyze(out).findings[0]
    assert finding.kind == "hang" and finding.ranks == [1]


def test_hang_in_ddp_start_up_broadcast_is_caught(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _trace(out, JOB, ["first"])
    assert _manifest(out)["status"] == "hang", proc.stderr
    report = json.loads((out / rundir.HANG_REPORT).read_text())
    assert report["stuck_ranks"] == [0] and report["ranks_not_in_collective"] == [1]
    assert report["verdict"].startswith("rank 1 never entered")
    frame = report["ranks"]["1"]["top_frame"]
    assert frame.startswith(f"{JOB}:{_line(JOB, 'never joins DDP')} ")
    assert _status(out, 0)["status"] == "hang" and _status(out, 1)["status"] == "hang"


# ----------------------------------------------------------------- the right rank is blamed


@pytest.mark.parametrize(
    ("mode", "signal", "line"),
    [("sigkill", "SIGKILL", "os.kill(os.getpid(), 9)"), ("segfault", "SIGSEGV", "string_at(0)")],
)
def test_rank_that_died_without_status_is_blamed(
    tmp_path: Path, mode: str, signal: str, line: str
) -> None:
    out = tmp_path / "run"
    proc = _trace(out, JOB, [mode, "6", "3"], hang_timeout=60)
    assert proc.returncode != 0
    m = _manifest(out)
    assert m["status"] == "failed", proc.stderr
    failure = m["failure"]
    assert failure["rank"] == 1 and failure["signal"] == signal, failure
    assert failure["last_step"] == 3
    assert m["failed_ranks"][0] == 1
    # rank 0 lost its peer: a consequence, named as such
    assert [c["rank"] for c in failure["consequences"]] == [0]
    assert "consequence" in failure["message"] or not _has_status(out, 0)
    finding = analyze(out).findings[0]
    assert finding.kind == "rank_failed" and finding.title.startswith("Rank 1 ")
    assert finding.evidence["cause_rank"] == 1 and finding.evidence["signal"] == signal
    if mode == "segfault":  # faulthandler's stack of the crash gives the line
        assert finding.location == f"{JOB}:{_line(JOB, line)}"


def test_a_frozen_rank_is_the_hang_and_its_peer_keeps_its_status(tmp_path: Path) -> None:
    """Issue 28 probe (B15): rank 1 stopped by SIGSTOP (frozen, not dead) mid-backward.
    The watchdog names it, and says it is stopped; rank 0, waiting inside backward, writes
    its status.json. Before, its finishing (from the hang poller thread) waited on DDP's
    reducer, which the main thread held, until the 15 s limit killed it: "rank(s) 0-1 wrote
    no status". The frozen rank is not continued (its code would run on) nor waited for."""
    out, pidfile = tmp_path / "run", tmp_path / "rank1.pid"
    try:
        proc = _trace(
            out, JOB, ["sigstop", "8", "3"], hang_timeout=6,
            env_extra={"REL_JOB_PIDFILE": str(pidfile)},
        )  # fmt: skip
    finally:
        if pidfile.exists():  # never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), 9)
    assert proc.returncode != 0
    m = _manifest(out)
    assert m["status"] == "hang", proc.stderr
    status = _status(out, 0)
    assert status["status"] == "hang", status
    assert 0 not in m["missing_status_ranks"], m["missing_status_ranks"]
    assert "finishing took over" not in proc.stderr, proc.stderr[-2000:]
    hang_line = next(x for x in proc.stderr.splitlines() if x.startswith("gpudiag: hang:"))
    assert "rank 1 never entered" in hang_line, hang_line
    assert "rank 1 is stopped (SIGSTOP" in hang_line, hang_line
    assert m["missing_status_ranks"] == [1]  # frozen: it wrote nothing, as said


@pytest.mark.parametrize("mode", ["big", "skipone"])
def test_middle_rank_that_diverges_is_named_first_on_three_ranks(tmp_path: Path, mode: str) -> None:
    """Issue 28: rank 1 of 3 all-reduces 1000 floats where the others reduce 1 (or skips
    one all_reduce). gloo aborts some other rank in C++ before anything is flushed; the
    aborted rank's last_call.json still says what it passed, so the majority names rank 1,
    and the desync (op, sizes, line) comes before the aborted rank's rank_failed."""
    out = tmp_path / "run"
    proc = _trace(out, JOB, [mode, "6", "3", "1"], nproc=3, hang_timeout=60)
    assert _manifest(out)["status"] == "failed", proc.stderr
    failure = _manifest(out)["failure"]
    if "aborted by gloo" in str(failure.get("message")):
        # the launcher names the aborted rank and says analyze compares the calls: the
        # rank that diverged is never called a consequence there (probe 28c, M03-M05)
        assert "a consequence, not the cause" not in failure["message"], failure["message"]
    findings = analyze(out).findings
    first = findings[0]
    assert first.kind == "desync" and first.ranks == [1], [f.title for f in findings]
    assert first.evidence["op"] == "all_reduce"
    if mode == "big":
        line = _line(JOB, "1000 if rank == odd else 1")
        assert first.location == f"{JOB}:{line}"
        assert {r: c["bytes"] for r, c in first.evidence["calls"].items()} == {
            "0": 4, "1": 4000, "2": 4
        }  # fmt: skip
        assert "rank 1 passed 4000 B" in first.title
    else:
        assert first.location == f"{JOB}:{_line(JOB, 'rank ODD never calls this one')}"
    _rank_failed_agrees_with_the_desync(findings, [1])


def _rank_failed_agrees_with_the_desync(findings: list, culprits: list[int]) -> None:
    """Issue 28 probe: rank_failed's cause_rank named the rank gloo aborted inside the
    collective while the desync named the rank that skipped it (or passed another size).
    Both now name the same cause; the aborted rank is one of the consequences."""
    desync = next(f for f in findings if f.kind == "desync")
    failed = next(f for f in findings if f.kind == "rank_failed")
    ev = failed.evidence
    assert ev["cause"] == "desync" and ev["cause_ranks"] == culprits, ev
    assert failed.ranks == culprits and failed.location == desync.location, failed.title
    assert ev["cause_rank"] == (culprits[0] if len(culprits) == 1 else None), ev
    consequences = {c["rank"] for c in ev["consequences"]}
    assert not consequences & set(culprits), ev["consequences"]
    assert set(desync.evidence["aborted_ranks"]) - set(culprits) <= consequences, ev
    who = f"Rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))} diverged"
    assert failed.title.startswith(who) if culprits else "no majority" in failed.title


def test_two_ranks_that_disagree_show_both_calls_first(tmp_path: Path) -> None:
    """On 2 ranks no majority says which rank diverged: the desync comes first anyway,
    with each rank's call (size and line), and blames neither."""
    out = tmp_path / "run"
    proc = _trace(out, JOB, ["big", "6", "3", "1"], nproc=2, hang_timeout=60)
    assert _manifest(out)["status"] == "failed", proc.stderr
    first = analyze(out).findings[0]
    assert first.kind == "desync" and first.ranks == [0, 1], first.title
    assert first.evidence["mismatch"] == "tie" and first.evidence["culprit_ranks"] == []
    assert {r: c["bytes"] for r, c in first.evidence["calls"].items()} == {"0": 4, "1": 4000}
    assert "either may be" in first.title
    findings = analyze(out).findings
    failed = next(f for f in findings if f.kind == "rank_failed")
    ev = failed.evidence  # no majority: no cause named, the aborted rank not blamed
    assert ev["cause"] == "desync" and ev["cause_rank"] is None and ev["cause_ranks"] == []
    assert failed.ranks == [0, 1] and "no majority" in failed.title, failed.title
    assert set(first.evidence["aborted_ranks"]) <= {c["rank"] for c in ev["consequences"]}


def test_a_mismatch_torchs_detail_mode_raises_on_is_not_called_a_gloo_abort(
    tmp_path: Path,
) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective's fingerprint first: both
    ranks raise a RuntimeError, none is aborted. The rank_failed finding said "gloo
    aborted rank 0 inside it" (seventh probe): the rank that raised is a failed
    consequence, with its error."""
    out = tmp_path / "run"
    proc = _trace(
        out, SCRIPTS / "detail_mismatch_job.py", [], nproc=2, hang_timeout=60,
        env_extra={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    )  # fmt: skip
    assert _manifest(out)["status"] == "failed", proc.stderr
    findings = analyze(out).findings
    assert findings[0].kind == "desync", findings[0].title
    failed = next(f for f in findings if f.kind == "rank_failed")
    assert "gloo aborted" not in failed.title, failed.title
    rows = {c["rank"]: c for c in failed.evidence["consequences"]}
    assert rows and all(c["status"] == "failed" for c in rows.values()), rows
    assert all(c["exc_type"] == "RuntimeError" for c in rows.values()), rows


def test_rank_sent_sigterm_from_outside_is_the_cause(tmp_path: Path) -> None:
    """Issue 28: `kill -TERM` to rank 1 alone: its peer then loses the connection. Rank 1
    is the cause, named first; the peer's "Connection closed by peer" a consequence."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-profile",
        "--no-lint", "--hang-timeout", "60", "--nproc-per-node", "2",
        "--master-port", str(coll_launch.free_port()), str(JOB), "sigterm-me", "400", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = rundir.table_path(rundir.rank_dir(out, 1), rundir.STEPS)
    info = rundir.rank_dir(out, 1) / rundir.RANK_INFO
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if info.is_file() and steps.is_file() and len(steps.read_text().splitlines()) >= 4:
            break
        time.sleep(0.1)
    os.kill(json.loads(info.read_text())["pid"], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    m = _manifest(out)
    assert m["status"] == "failed" and m["failed_ranks"][0] == 1, stderr
    assert m["failure"]["rank"] == 1 and m["failure"]["signal"] == "SIGTERM"
    assert "from outside the job" in m["failure"]["message"]
    first = analyze(out).findings[0]
    assert first.kind == "rank_failed" and first.ranks == [1], first.title


def _has_status(out: Path, rank: int) -> bool:
    return (rundir.rank_dir(out, rank) / rundir.STATUS).is_file()


# ----------------------------------------------------------------- torch.multiprocessing.spawn


def test_mp_spawn_workers_are_traced_as_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 200 ms of sleep per step on rank 1, 20 steps: under a loaded machine's noise (steps
    # of 160 +- 40 ms were seen) 50 ms was not always told from chance, rightly
    proc = _trace(out, SPAWN, ["20", "1", "0.2"], nproc=1, hang_timeout=60)
    assert proc.returncode == 0, proc.stderr
    m = _manifest(out)
    assert m["status"] == "ok" and m["world_size"] == 2, proc.stderr
    assert m["steps_completed"] == {"0": 20, "1": 20}
    infos = [json.loads((rundir.rank_dir(out, r) / rundir.RANK_INFO).read_text()) for r in (0, 1)]
    assert [i["backend"] for i in infos] == ["gloo", "gloo"]
    assert len({i["pid"] for i in infos}) == 2
    res = analyze(out)
    straggler = next(f for f in res.findings if f.kind == "straggler")
    assert straggler.ranks == [1]
    assert straggler.cost_ms_per_step > 100


# ----------------------------------------------------------------- collective mismatches


def test_rank_that_skips_an_all_reduce_is_named_with_the_collective(tmp_path: Path) -> None:
    """3 ranks; rank 2 skips one all_reduce: its next collective (a DDP bucket) meets the
    others' all_reduce, gloo aborts some rank and disconnects the rest."""
    out = tmp_path / "run"
    proc = _trace(out, JOB, ["skip", "6", "3"], nproc=3, hang_timeout=60)
    assert _manifest(out)["status"] == "failed", proc.stderr
    finding = analyze(out).findings[0]
    assert finding.kind == "desync" and finding.ranks == [2], finding.title
    ev = finding.evidence
    assert (ev["op"], ev["pg_name"], ev["mismatch"]) == ("all_reduce", "0", "line")
    line = _line(JOB, "the last rank never calls this one")
    assert ev["calls"]["0"]["bytes"] == 4096
    assert ev["calls"]["0"]["callsite"].startswith(f"{JOB}:{line} ")
    assert ev["calls"]["2"]["callsite"] is None  # DDP's bucket: no user line
    assert f"seq {ev['seq']}" in finding.title
    assert finding.location == f"{JOB}:{line}"
    _rank_failed_agrees_with_the_desync(analyze(out).findings, [2])


def test_same_op_different_sizes_names_the_rank_and_the_collective(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _trace(out, JOB, ["size", "6", "3"], nproc=3, hang_timeout=60)
    assert _manifest(out)["status"] == "failed", proc.stderr
    finding = analyze(out).findings[0]
    assert finding.kind == "desync", finding.title
    ev = finding.evidence
    line = _line(JOB, "1024 if rank != last else 512")
    assert finding.location == f"{JOB}:{line}"
    assert ev["op"] == "all_reduce" and ev["mismatch"] in ("size", "size_unknown")
    known = {r: c["bytes"] for r, c in ev["calls"].items() if c["bytes"] is not None}
    assert set(known.values()) <= {4096, 2048}
    # whichever rank gloo aborted, the culprit is rank 2 (the others agree on 4096 B)
    assert finding.ranks == [2]
    _rank_failed_agrees_with_the_desync(analyze(out).findings, [2])
