"""Ranks launched separately (each under its own single-process `gpudiag trace --out`)
that disagree at one collective: `gpudiag analyze A B` reads the parts as one run and
gives the same desync-first report as one torchrun launch (issue 28, F2), without each
part's "rank(s) [...] left nothing in this directory" note (M1)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis.mismatch import mismatch_findings
from tests.traced_jobs import run_each_rank

SCRIPTS = Path(__file__).parent / "scripts"
JOB = SCRIPTS / "separate_desync_job.py"
ELSEWHERE = (
    "rank(s) [{other}] of the world of 2 left nothing in this directory: started by another "
    "launcher (trace each into its own --out and `gpudiag analyze` them side by side) or not "
    "traced"
)


def _manifest(rank: int, failure: dict[str, Any], code: int) -> dict[str, Any]:
    return {
        "status": "failed",
        "exit_code": code,
        "world_size": 2,
        "backend": "gloo",
        "init_method": "tcp://127.0.0.1:29500",
        "traced_ranks": [rank],
        "untraced_ranks": [1 - rank],
        "ranks_elsewhere": [1 - rank],
        "failed_ranks": [rank],
        "failure": failure,
        "incomplete": [ELSEWHERE.format(other=1 - rank)],
        "steps_completed": {str(rank): 3},
        "start_ns": 0,
        "end_ns": 10_000,
    }


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _fake_parts(tmp_path: Path) -> tuple[Path, Path]:
    """Rank 0 aborted by gloo in a 4 B all_reduce (only its last_call.json says so);
    rank 1 raised "Connection reset by peer" in its 4000 B one, at the same seq."""
    a, b = tmp_path / "A", tmp_path / "B"
    aborted = {"rank": 0, "exc_type": "died", "message": "SIGABRT", "exit_code": 134}
    _write(a / rundir.MANIFEST, _manifest(0, aborted, 134))
    _write(rundir.rank_dir(a, 0) / rundir.RANK_INFO, {"rank": 0, "world_size": 2})
    _write(
        rundir.rank_dir(a, 0) / rundir.LAST_CALL,
        {
            "op": "all_reduce",
            "pg_name": "0",
            "seq": 10,
            "bytes": 4,
            "callsite": "job.py:70 in main",
        },
    )
    reset = "RuntimeError: Connection reset by peer"
    own = {"rank": 1, "exc_type": "RuntimeError", "message": reset, "exit_code": 1}
    _write(b / rundir.MANIFEST, _manifest(1, own, 1))
    _write(rundir.rank_dir(b, 1) / rundir.RANK_INFO, {"rank": 1, "world_size": 2})
    _write(
        rundir.rank_dir(b, 1) / rundir.STATUS,
        {"rank": 1, "status": "failed", "exit_code": 1, "exc_type": "RuntimeError"},
    )
    row = {
        "pg_name": "0",
        "seq": 10,
        "op": "all_reduce",
        "bytes": 4000,
        "callsite": "job.py:57 in main",
        "error": reset,
    }
    table = rundir.table_path(rundir.rank_dir(b, 1), rundir.COLLECTIVE_TIMES)
    table.write_text(json.dumps(row) + "\n")
    return a, b


def test_merged_parts_carry_each_ranks_call_to_the_desync(tmp_path: Path) -> None:
    a, b = _fake_parts(tmp_path)
    for order in ([a, b], [b, a]):
        run = rundir.load_run(order)
        (finding,) = mismatch_findings(run)
        assert finding.kind == "desync" and finding.ranks == [0, 1], finding.title
        assert finding.evidence["mismatch"] == "tie" and finding.evidence["seq"] == 10
        calls = finding.evidence["calls"]
        assert {r: (c["bytes"], c["callsite"]) for r, c in calls.items()} == {
            "0": (4, "job.py:70 in main"),
            "1": (4000, "job.py:57 in main"),
        }
        assert finding.evidence["aborted_ranks"] == [0]


def test_merged_parts_drop_the_note_on_ranks_another_part_holds(tmp_path: Path) -> None:
    a, b = _fake_parts(tmp_path)
    for order in ([a, b], [b, a]):
        run = rundir.load_run(order)
        assert not [w for w in run.warnings if "left nothing" in w], run.warnings
        assert run.manifest["incomplete"] is None and run.manifest["ranks_elsewhere"] == []
    # one part alone still says where the other ranks went
    alone = rundir.load_run(a)
    assert any("left nothing in this directory" in w for w in alone.warnings)


def test_merged_parts_name_the_ranks_no_part_holds() -> None:
    parts = []
    for rank in (0, 1):
        m = _manifest(rank, {"rank": rank, "exc_type": "died", "exit_code": 134}, 134)
        m["world_size"], m["ranks_elsewhere"] = 3, [r for r in range(3) if r != rank]
        m["incomplete"] = [
            f"rank(s) {m['ranks_elsewhere']} of the world of 3 left nothing in this "
            "directory: started by another launcher (...) or not traced",
            f"rank {rank}: could not write steps.jsonl",
        ]
        parts.append((0, m))
    merged = rundir.merge_manifests(parts)
    assert merged["ranks_elsewhere"] == [2]
    reasons = merged["incomplete"]
    assert reasons[:2] == [
        "rank 0: could not write steps.jsonl",
        "rank 1: could not write steps.jsonl",
    ]
    assert len(reasons) == 3 and reasons[2].startswith("rank(s) [2] of the world of 3"), reasons


# ----------------------------------------------------------------- real gloo jobs (slow)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _by_hand(tmp_path: Path) -> list[Path]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    outs = [tmp_path / "a", tmp_path / "b"]
    trace = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--no-profile"]
    commands = [
        [*trace, "--hang-timeout", "60", "--out", str(out), str(JOB), str(rank)]
        for rank, out in enumerate(outs)
    ]
    run_each_rank(commands, env, 300)
    return outs


@pytest.mark.slow
def test_separately_launched_ranks_that_disagree_show_both_calls_first(tmp_path: Path) -> None:
    """Rank 1 all-reduces 1000 floats where rank 0 reduces 1, each rank under its own
    `gpudiag trace`: as under one launch (test_reliability_gloo.py::
    test_two_ranks_that_disagree_show_both_calls_first) the desync comes first, with both
    calls and no culprit, in either order of the directories."""
    a, b = _by_hand(tmp_path)
    assert json.loads((a / "manifest.json").read_text())["status"] == "failed"
    reports = [analyze([a, b]), analyze([b, a])]
    for report in reports:
        first = report.findings[0]
        assert first.kind == "desync" and first.ranks == [0, 1], first.title
        assert first.evidence["mismatch"] == "tie" and first.evidence["culprit_ranks"] == []
        calls = first.evidence["calls"]
        assert {r: c["bytes"] for r, c in calls.items()} == {"0": 4, "1": 4000}
        assert all(str(JOB) in c["callsite"] for c in calls.values()), calls
        assert "either may be" in first.title
        failed = next(f for f in report.findings if f.kind == "rank_failed")
        ev = failed.evidence
        assert ev["cause"] == "desync" and ev["cause_rank"] is None and ev["cause_ranks"] == []
        assert failed.ranks == [0, 1] and "no majority" in failed.title, failed.title
        assert set(first.evidence["aborted_ranks"]) <= {c["rank"] for c in ev["consequences"]}
        run = rundir.load_run([a, b])
        assert not [w for w in run.warnings if "left nothing" in w], run.warnings
    assert reports[0].findings[0] == reports[1].findings[0]
