"""Hang watchdog and desync reports on real 2-rank gloo jobs that hang."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

from gpudiag import rundir  # noqa: E402
from gpudiag.capture.watchdog import HangWatchdog, top_user_frame  # noqa: E402

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
HARNESS = "coll_harness.py"


def _run_until_hang(mode: str, run: Path) -> dict:
    procs = coll_launch.start(mode, run, steps=5)
    fired_at: list[float] = []

    def on_hang(report: dict) -> None:
        fired_at.append(time.monotonic())
        for p in procs:
            p.kill()

    # Start watching once both ranks have recorded a step: on a loaded machine the
    # second rank's `import torch` alone can outlast the short test timeout.
    tables = [rundir.table_path(rundir.rank_dir(run, r), rundir.COLLECTIVE_TIMES) for r in (0, 1)]
    deadline = time.monotonic() + 60
    while not all(t.exists() for t in tables) and time.monotonic() < deadline:
        time.sleep(0.1)
    watchdog = HangWatchdog(run, TIMEOUT_S, on_hang=on_hang, poll_s=0.2)
    watchdog.start()
    codes, output = coll_launch.finish(procs, timeout=90)
    watchdog.stop()
    assert watchdog.fired, output
    assert fired_at, output
    return {
        "report": json.loads((run / rundir.HANG_REPORT).read_text()),
        "codes": codes,
        "output": output,
        "run": run,
    }


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run_until_hang("hang", tmp_path_factory.mktemp("hang"))


def test_watchdog_fires_and_ends_job(hang: dict) -> None:
    report = hang["report"]
    assert hang["codes"] == [-9, -9]  # killed by on_hang, not finished on their own
    assert TIMEOUT_S <= report["detected_after_s"] < TIMEOUT_S + 2
    assert rundir.load_run(hang["run"]).hang_report == report


def test_report_names_rank_not_in_collective(hang: dict) -> None:
    report = hang["report"]
    assert report["stuck_ranks"] == [0]
    assert report["ranks_not_in_collective"] == [1]
    waiting = report["ranks"]["0"]["inflight"]
    assert len(waiting) == 1
    # 5 warm-up all_reduces, then the one rank 1 skips: seq 6 on the world group
    assert (waiting[0]["op"], waiting[0]["seq"], waiting[0]["bytes"]) == ("all_reduce", 6, 16384)
    assert HARNESS in waiting[0]["callsite"]
    assert waiting[0]["pg_ranks"] == [0, 1]
    assert report["verdict"].startswith("rank 1 never entered all_reduce seq 6 (pg 0)")
    assert "rank 0 is waiting in" in report["verdict"]
    assert report["desync"] is None
    for r in ("0", "1"):
        assert report["ranks"][r]["last_step"] == 4
        assert report["ranks"][r]["answered"] is True


def test_stacks_for_both_ranks(hang: dict) -> None:
    run = hang["run"]
    for rank, func_line in ((0, "dist.all_reduce(torch.ones(4096))"), (1, "time.sleep(120)")):
        stacks = (rundir.rank_dir(run, rank) / rundir.STACKS).read_text()
        assert "most recent call first" in stacks
        frame = top_user_frame(stacks)
        assert frame is not None and HARNESS in frame
        line = int(frame.split(":")[1].split()[0])
        source = (Path(__file__).parent / "scripts" / HARNESS).read_text().splitlines()
        assert func_line in source[line - 1]
        assert hang["report"]["ranks"][str(rank)]["top_frame"] == frame
    # rank 0 was dumped while blocked inside the C++ collective
    assert "distributed_c10d.py" in (rundir.rank_dir(run, 0) / rundir.STACKS).read_text()


def test_desync_different_ops_at_same_seq(tmp_path: Path) -> None:
    result = _run_until_hang("desync_ops", tmp_path)
    report = result["report"]
    assert report["desync"] is not None, report
    assert report["desync"]["seq"] == 6
    calls = report["desync"]["calls"]
    assert calls["0"]["op"] == "all_reduce" and calls["1"]["op"] == "broadcast"
    assert report["verdict"].startswith("desync at seq 6 (pg 0)")
    assert report["stuck_ranks"] == [0, 1]


def test_size_mismatch_what_gloo_does(tmp_path: Path) -> None:
    """Gloo does not hang on a size mismatch: the receiving side aborts in C++ and the
    other rank's collective raises. The raising rank's record names the failed op, its
    seq and size; the aborted rank leaves its stacks through faulthandler."""
    codes, output = coll_launch.finish(
        coll_launch.start("size_mismatch", tmp_path, steps=3), timeout=90
    )
    assert sorted(codes) == [-6, 0], output  # one rank aborted (SIGABRT), one survived
    assert "collective mismatch" in output or "size" in output
    survivor = codes.index(0)
    raised = json.loads((tmp_path / f"rank{survivor}" / "harness_size_mismatch.json").read_text())
    assert raised["raised"]
    times = list(
        rundir.iter_jsonl(
            rundir.table_path(rundir.rank_dir(tmp_path, survivor), rundir.COLLECTIVE_TIMES)
        )
    )
    failed = [t for t in times if t.get("error")]
    assert len(failed) == 1
    assert (failed[0]["op"], failed[0]["seq"]) == ("all_reduce", 4)
    assert failed[0]["shape"] == [1000 if survivor == 0 else 10]
    aborted = 1 - survivor
    stacks = (rundir.rank_dir(tmp_path, aborted) / rundir.STACKS).read_text()
    assert "Fatal Python error: Aborted" in stacks
    assert "mode_size_mismatch" in stacks
