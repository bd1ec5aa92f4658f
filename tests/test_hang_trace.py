"""A hang traced end to end: `gpudiag trace --hang-timeout` on an unmodified script."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

from gpudiag import rundir  # noqa: E402

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "coll_train.py"
HANG_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = tmp_path_factory.mktemp("hang_trace") / "run"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-profile",
        "--no-lint", "--hang-timeout", str(HANG_TIMEOUT_S), "--on-hang", "end", "--nproc-per-node", "2",
        "--master-port", str(coll_launch.free_port()), str(SCRIPT), "4", "hang",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    return {"run": run, "proc": proc, "wall_s": time.monotonic() - t0}


def test_hang_detected_and_job_ended(traced: dict) -> None:
    proc = traced["proc"]
    assert proc.returncode != 0, proc.stderr
    assert traced["wall_s"] < 200  # ended by the watchdog, not by rank 1's 300 s sleep
    report = rundir.load_run(traced["run"]).hang_report
    assert report is not None, proc.stderr
    assert HANG_TIMEOUT_S <= report["detected_after_s"] < HANG_TIMEOUT_S + 2


def test_hang_report_names_rank_op_seq_and_lines(traced: dict) -> None:
    report = rundir.load_run(traced["run"]).hang_report
    assert report["stuck_ranks"] == [0] and report["ranks_not_in_collective"] == [1]
    waiting = report["ranks"]["0"]["inflight"]
    assert [(w["op"], w["bytes"]) for w in waiting] == [("all_reduce", 1024)]
    source = SCRIPT.read_text().splitlines()
    # the all_reduce rank 0 waits in and the sleep rank 1 is in, by line
    line0 = int(waiting[0]["callsite"].split(":")[1].split()[0])
    assert "dist.all_reduce(torch.ones(256))" in source[line0 - 1]
    line1 = int(report["ranks"]["1"]["top_frame"].split(":")[1].split()[0])
    assert "time.sleep(300)" in source[line1 - 1]
    seq = waiting[0]["seq"]
    assert report["verdict"].startswith(f"rank 1 never entered all_reduce seq {seq} (pg 0)")
    # Flight Recorder agrees: rank 0 entered seq N (never completed), rank 1 stopped at N-1
    coll = rundir.load_run(traced["run"]).collectives
    world = coll[coll["pg_name"] == "0"]
    assert world[world["rank"] == 1]["seq"].max() == seq - 1
    stuck = world[(world["rank"] == 0) & (world["seq"] == seq)].iloc[0]
    assert (stuck["op"], stuck["in_bytes"]) == ("all_reduce", 1024)
    assert stuck["end_ns"] is None or stuck["end_ns"] != stuck["end_ns"]  # None or NaN
    for rank in ("0", "1"):
        assert report["ranks"][rank]["last_step"] == 3  # 4 steps, numbered from 0


def test_hang_stacks_for_every_rank(traced: dict) -> None:
    run = rundir.load_run(traced["run"])
    assert sorted(run.stacks) == [0, 1]
    for text in run.stacks.values():
        assert "coll_train.py" in text and "most recent call first" in text
