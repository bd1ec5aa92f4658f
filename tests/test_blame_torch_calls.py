"""The blame of a collective timeout, from the ranks' files (fast: no job runs). A
collective torch issued itself (DDP's gradient buckets, its start-up sync) is in no
rank's last_call.json, only in its Flight Recorder rows: the rank that never issued the
call a peer timed out in is the cause, as for a call of the script (probe 28g, N5; the
real jobs: `test_collective_timeout.py::test_a_rank_late_to_a_collective_torch_issues_is_the_cause`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture import launch_outcome

TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
WAITER_TB = 'Traceback (most recent call last):\n  File "/job/train.py", line 30, in <module>\n    loss.backward()\nRuntimeError: x\n'
LATE_TB = 'Traceback (most recent call last):\n  File "/job/train.py", line 27, in <module>\n    time.sleep(60)\nSIGTERM\n'


def _fr(seq: int, t_ns: int, op: str = "all_reduce", pg: str = "0") -> dict[str, Any]:
    return {"pg_name": pg, "pg_ranks": [0, 1], "seq": seq, "op": op, "enqueue_ns": t_ns,
            "record_id": seq, "source": "flight_recorder"}  # fmt: skip


def _rank(
    run: Path, rank: int, status: dict[str, Any], rows: list[dict], last: dict | None
) -> None:
    rundir.write_rank_json(run, rank, rundir.RANK_INFO, {"rank": rank, "world_size": 2})
    rundir.write_rank_json(run, rank, rundir.STATUS, {"rank": rank, **status})
    table = rundir.table_path(rundir.rank_dir(run, rank), rundir.COLLECTIVES)
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rundir.rank_dir(run, rank) / rundir.LAST_CALL).write_text(json.dumps(last) if last else "")


def _timed_out(end_ns: int) -> dict[str, Any]:
    return {"status": "failed", "exit_code": 1, "exc_type": "RuntimeError",
            "message": TIMEOUT, "traceback": WAITER_TB, "end_ns": end_ns}  # fmt: skip


INTERRUPTED = {"status": "interrupted", "exit_code": 143, "exc_type": "SIGTERM",
               "message": "SIGTERM", "traceback": LATE_TB, "end_ns": 200}  # fmt: skip


def _failure(run: Path) -> dict[str, Any]:
    return launch_outcome.decide_outcome(run, 1, None, False, 2)["failure"]


def test_a_peer_that_never_issued_a_bucket_all_reduce_is_the_cause(tmp_path: Path) -> None:
    """DDP's gradient all_reduce (seq 9) is only in rank 0's Flight Recorder rows."""
    _rank(tmp_path, 0, _timed_out(100), [_fr(s, 10 + s) for s in range(1, 10)], None)
    _rank(tmp_path, 1, INTERRUPTED, [_fr(s, 10 + s) for s in range(1, 9)], None)
    failure = _failure(tmp_path)
    assert failure["rank"] == 1 and failure["exc_type"] == "late_to_collective", failure
    assert failure["waiting_rank"] == 0
    assert failure["collective"] == {
        "op": "all_reduce", "pg_name": "0", "seq": 9,
        "callsite": "/job/train.py:30", "issued_by": "torch",
    }  # fmt: skip
    assert "issued by torch, not the script) at rank 0's /job/train.py:30" in failure["message"]
    assert "this rank was at /job/train.py:27" in failure["message"]


def test_a_peer_that_issued_the_call_too_is_not_blamed(tmp_path: Path) -> None:
    """Both ranks issued seq 9: no rank was late to it; the timed-out rank stays the cause."""
    _rank(tmp_path, 0, _timed_out(100), [_fr(s, 10 + s) for s in range(1, 10)], None)
    _rank(tmp_path, 1, INTERRUPTED, [_fr(s, 10 + s) for s in range(1, 10)], None)
    failure = _failure(tmp_path)
    assert failure["rank"] == 0 and failure["exc_type"] == "RuntimeError", failure


def test_the_scripts_own_call_keeps_its_line(tmp_path: Path) -> None:
    """The last user call's own Flight Recorder row (same group and seq) is no later call:
    the collective is the script's, at its line."""
    last = {"op": "all_reduce", "pg_name": "0", "seq": 6, "callsite": "/job/train.py:9",
            "enter_ns": 15}  # fmt: skip
    _rank(tmp_path, 0, _timed_out(100), [_fr(s, 10 + s) for s in range(1, 7)], last)
    _rank(tmp_path, 1, INTERRUPTED, [_fr(s, 10 + s) for s in range(1, 6)], None)
    failure = _failure(tmp_path)
    assert failure["rank"] == 1 and failure["collective"]["issued_by"] == "script"
    assert failure["collective"]["callsite"] == "/job/train.py:9", failure


def test_a_later_call_of_another_group_is_the_one_waited_in(tmp_path: Path) -> None:
    """The script's last call was in group 1; torch then issued one in group 0 (issued
    after the user call was entered): that is the call rank 0 timed out in."""
    last = {"op": "broadcast", "pg_name": "1", "seq": 3, "callsite": "/job/train.py:9",
            "enter_ns": 50}  # fmt: skip
    rows = [_fr(3, 51, "broadcast", "1"), *(_fr(s, 40 + s) for s in range(1, 6))]
    _rank(tmp_path, 0, _timed_out(100), [*rows, _fr(6, 60)], last)
    _rank(tmp_path, 1, INTERRUPTED, rows, last)
    failure = _failure(tmp_path)
    assert failure["rank"] == 1, failure
    assert failure["collective"]["seq"] == 6 and failure["collective"]["pg_name"] == "0"
    assert failure["collective"]["issued_by"] == "torch"
