"""Blame the right rank (issue 28, F1 and F6).

F1: a rank that leaves the job with exit code 0 (``sys.exit(0)``, ``os._exit(0)``, or a
skipped final ``dist.barrier()``) while its peers are still in collectives is the cause;
the peers' "Connection closed by peer" errors are consequences. A rank that exits 0
after a peer already failed is not.

F6: ranks launched separately (one ``gpudiag trace`` per rank, ``rank=`` passed to
``init_process_group``) read as one run by ``gpudiag analyze A B``: the failure is
decided across the parts, and the order of the directories does not change the answer.

The slow tests run real 2-rank gloo jobs (tests/scripts/early_exit_job.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis.failures import rank_failed_findings
from gpudiag.capture import blame
from tests.traced_jobs import run_each_rank

JOB = Path(__file__).parent / "scripts" / "early_exit_job.py"
PEER = "RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:5521"


def _status(status: str, end_ns: int, exc: tuple[str, str] | None = None) -> dict[str, Any]:
    exc_type, message = exc or (None, None)
    return {
        "status": status,
        "exit_code": 0 if status == "ok" else 1,
        "exc_type": exc_type,
        "message": message,
        "end_ns": end_ns,
        "steps_completed": 3,
    }


# ----------------------------------------------------------------- the decision (fast)


def test_a_rank_that_exits_0_before_its_peer_loses_the_connection_is_the_cause() -> None:
    ends = {
        0: blame.RankEnd(0, _status("failed", 2_000, PEER)),
        1: blame.RankEnd(1, _status("ok", 1_000)),
    }
    assert blame.find_cause(ends) == (1, [0])
    failure = blame.early_exit_failure(ends[1], [ends[0]])
    assert failure["rank"] == 1 and failure["exc_type"] == rundir.EARLY_EXIT
    assert "rank 0 then lost the connection" in failure["message"]
    assert not rundir.is_peer_error(failure)


def test_a_rank_without_status_not_among_the_agents_failures_exited_0() -> None:
    """os._exit(0): no status.json; the agent listed only rank 0 as failed."""
    end = blame.RankEnd(1, None, exitcode=0, last_write_ns=1_000, last_step=2)
    assert end.exited_zero and not end.died_without_status
    ends = {0: blame.RankEnd(0, _status("failed", 2_000, PEER)), 1: end}
    assert blame.find_cause(ends) == (1, [0])
    assert "no status written" in blame.early_exit_failure(end, [ends[0]])["message"]


@pytest.mark.parametrize(
    "ends",
    [
        # it exited 0 after its peer had failed (it caught its own peer error)
        {
            0: blame.RankEnd(0, _status("failed", 1_000, PEER)),
            1: blame.RankEnd(1, _status("ok", 2_000)),
        },
        # an error of its own comes first, even after the early exit
        {
            0: blame.RankEnd(0, _status("failed", 2_000, ("ValueError", "bad batch"))),
            1: blame.RankEnd(1, _status("ok", 1_000)),
        },
    ],
    ids=["exit-0-after-the-failure", "own-error"],
)
def test_exit_0_is_not_blamed_when_it_is_not_the_cause(ends: dict[int, blame.RankEnd]) -> None:
    assert blame.find_cause(ends) == (0, [])


def test_a_normal_end_has_no_cause() -> None:
    ends = {r: blame.RankEnd(r, _status("ok", 1_000 + r)) for r in (0, 1)}
    assert blame.find_cause(ends) is None
    assert rundir.left_early({r: e.status or {} for r, e in ends.items()}) == []


def _part(rank: int, failure: dict[str, Any] | None, code: int) -> dict[str, Any]:
    return {
        "status": "failed" if failure else "ok",
        "exit_code": code,
        "world_size": 2,
        "init_method": "tcp://127.0.0.1:29500",
        "traced_ranks": [rank],
        "failed_ranks": [rank] if failure else [],
        "failure": failure,
        "steps_completed": {str(rank): 3},
        "start_ns": 0,
        "end_ns": 10_000,
    }


def test_merged_failure_of_separate_launches_does_not_depend_on_the_order() -> None:
    peer = {"rank": 0, "exc_type": PEER[0], "message": PEER[1], "exit_code": 1, "end_ns": 2_000}
    own = {"rank": 1, "exc_type": "ValueError", "message": "boom", "exit_code": 1, "end_ns": 3_000}
    a, b = _part(0, peer, 1), _part(1, own, 1)
    one = rundir.merge_manifests([(0, a), (0, b)])
    other = rundir.merge_manifests([(0, b), (0, a)])
    assert one == other
    assert one["failure"]["rank"] == 1 and one["failed_ranks"] == [1, 0]
    assert [c["rank"] for c in one["failure"]["consequences"]] == [0]


def test_merged_failure_names_a_rank_that_left_early_from_the_statuses() -> None:
    peer = {"rank": 0, "exc_type": PEER[0], "message": PEER[1], "exit_code": 1, "end_ns": 2_000}
    a, b = _part(0, peer, 1), _part(1, None, 0)
    statuses = {0: _status("failed", 2_000, PEER), 1: _status("ok", 1_000)}
    for parts in ([(0, a), (0, b)], [(0, b), (0, a)]):
        merged = rundir.merge_manifests(parts, statuses)
        assert merged["failure"]["rank"] == 1, merged["failure"]
        assert merged["failure"]["exc_type"] == rundir.EARLY_EXIT
        assert merged["status"] == "failed" and merged["exit_code"] == 1
    # without the statuses: the peer error is all there is
    assert rundir.merge_manifests([(0, b), (0, a)])["failure"]["rank"] == 0


def test_rank_failed_without_a_verdict_names_the_rank_that_left_early() -> None:
    statuses = {0: _status("failed", 2_000, PEER), 1: _status("ok", 1_000)}
    (finding,) = rank_failed_findings({"status": "failed"}, statuses)
    assert finding.ranks == [1] and "left the job early" in finding.title


# ----------------------------------------------------------------- real gloo jobs (slow)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(out: Path) -> list[str]:
    return [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
        "--no-profile", "--hang-timeout", "60",
    ]  # fmt: skip


def _final_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.startswith("gpudiag: run")][-1]


def _first_finding(*dirs: Path) -> Any:
    result = analyze(list(dirs) if len(dirs) > 1 else dirs[0])
    return result.findings[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sysexit0", "osexit0", "barrier"])
def test_rank_that_leaves_with_exit_0_is_blamed(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [*_command(out), "--nproc-per-node", "2", "--master-port", str(_free_port())]
        + [str(JOB), mode, "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "failed" and m["failed_ranks"][0] == 1, m
    failure = m["failure"]
    assert failure["rank"] == 1 and failure["exc_type"] == rundir.EARLY_EXIT, failure
    assert [c["rank"] for c in failure["consequences"]] == [0]
    assert "rank 1 failed: early_exit: left the job early" in _final_line(proc.stderr)
    finding = _first_finding(out)
    assert finding.kind == "rank_failed" and finding.ranks == [1], finding.title


@pytest.mark.slow
def test_rank_that_exits_0_after_its_peer_failed_is_not_blamed(tmp_path: Path) -> None:
    """Rank 0 raises; rank 1 catches the peer error that follows and exits 0."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [*_command(out), "--nproc-per-node", "2", "--master-port", str(_free_port())]
        + [str(JOB), "late0", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["failure"]["rank"] == 0 and m["failure"]["exc_type"] == "ValueError", m
    assert _first_finding(out).ranks == [0]


def _by_hand(tmp_path: Path, mode: str) -> list[Path]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    outs = [tmp_path / "a", tmp_path / "b"]
    commands = [[*_command(out), str(JOB), mode, "6", str(rank)] for rank, out in enumerate(outs)]
    run_each_rank(commands, env, 300)
    return outs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "exc_type"),
    [
        ("raise", "ValueError"),
        ("sysexit0", rundir.EARLY_EXIT),
        ("osexit0", rundir.EARLY_EXIT),
        ("osexit3", "died"),
    ],
)
def test_ranks_launched_separately_blame_the_cause_in_any_order(
    tmp_path: Path, mode: str, exc_type: str
) -> None:
    a, b = _by_hand(tmp_path, mode)
    # rank 1's own launcher knows its rank ran alone: rank 0 ran elsewhere
    m1 = json.loads((b / "manifest.json").read_text())
    assert m1["ranks_elsewhere"] == [0], m1
    assert m1["failure"] is None or m1["failure"]["rank"] == 1, m1["failure"]
    manifests = [rundir.load_run([a, b]).manifest, rundir.load_run([b, a]).manifest]
    for manifest in manifests:
        failure = manifest["failure"]
        assert failure["rank"] == 1 and failure["exc_type"] == exc_type, failure
        assert manifest["failed_ranks"] == [1, 0] and manifest["status"] == "failed"
    assert manifests[0] == manifests[1]
    findings = [analyze([a, b]).findings[0], analyze([b, a]).findings[0]]
    for finding in findings:
        assert finding.kind == "rank_failed" and finding.ranks == [1], finding.title
    assert findings[0] == findings[1]
    # said as what they are: not the node directories of a multi-node launch
    assert rundir.launched_separately([a, b]) and not rundir.launched_separately([a])
