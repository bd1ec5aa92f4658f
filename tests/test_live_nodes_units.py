"""The live view over the per-node directories of one multi-node job, on a recorded run
laid out as two nodes (tests/live_nodes_split.py; node 1's clock 5 s behind): one job,
found and merged as `gpudiag analyze` does, node 1 put on node 0's clock as the loader
puts it, and every table still read incrementally."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpudiag import rundir  # noqa: E402
from gpudiag.analysis import live_snapshot as live  # noqa: E402
from tests.live_nodes_split import SAMPLE, split_job  # noqa: E402

OFFSET_NS = 5_000_000_000  # node 1's clock 5 s behind node 0's


@pytest.fixture
def job(tmp_path: Path) -> Path:
    split_job(tmp_path / "job", OFFSET_NS)
    return tmp_path / "job"


def _dirs(job: Path) -> list[Path]:
    return [job / "node0", job / "node1"]


def test_parent_and_directories_open_as_one_job(job: Path) -> None:
    for target in (job, _dirs(job)):
        reader = rundir.open_live(target)
        assert isinstance(reader, rundir.JobLiveReader)
        assert reader.parts == _dirs(job)
    assert isinstance(rundir.open_live(SAMPLE), rundir.LiveReader)
    # directories of different jobs are refused in one line
    with pytest.raises(rundir.RunFormatError, match="not the per-node directories of one job"):
        rundir.open_live([job / "node0", SAMPLE])


def test_merged_view_equals_the_loader_and_the_one_host_recording(job: Path) -> None:
    batch = rundir.open_live(job).poll()
    assert batch.status == "running" and batch.writing
    assert set(batch.manifest["nodes"]) == {1}
    # every node's rows on node 0's clock, exactly as load_run puts them
    loaded = rundir.load_run(job)
    for rank in (0, 1, 2, 3):
        ends = [r["end_ns"] for r in batch.rank_rows[rundir.STEPS][rank]]
        assert ends == loaded.steps[loaded.steps["rank"] == rank]["end_ns"].tolist()
    # ... which are the recording's own times (one host: one clock)
    original = rundir.load_run(SAMPLE)
    assert loaded.steps["end_ns"].tolist() == original.steps["end_ns"].tolist()

    snap = live.LiveMonitor(_dirs(job)).refresh().snapshot
    whole = live.LiveMonitor(SAMPLE).refresh().snapshot
    assert snap.state == "running"
    assert {r.rank: r.node for r in snap.ranks} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert [n.node for n in snap.nodes] == [0, 1]
    assert snap.lagging == whole.lagging == [2]  # analyze's straggler, across the nodes
    for mine, theirs in zip(snap.ranks, whole.ranks, strict=True):
        assert mine.step == theirs.step
        assert mine.median_step_ms == theirs.median_step_ms
        # "since last step": node 1's ranks are not 5 s behind
        assert abs(mine.since_last_step_s - theirs.since_last_step_s) < 1.0


def test_stuck_collective_across_nodes_on_one_clock(job: Path) -> None:
    """Ranks 0 and 1 (node 0) and 2 (node 1) wait in one all_reduce, rank 3 never came:
    waiting_s counts from the earliest entry on node 0's clock."""
    import time

    now = time.time_ns()
    entered = now - 20 * 10**9
    for rank, node in ((0, 0), (1, 0), (2, 1)):
        clock = OFFSET_NS if node == 1 else 0
        doc = {
            "rank": rank,
            "t_ns": now - clock,
            "inflight": [
                {
                    "pg_name": "0",
                    "seq": 999,
                    "op": "all_reduce",
                    "enter_ns": entered - clock + (10**9 if rank == 2 else 0),
                    "pg_ranks": [0, 1, 2, 3],
                }
            ],
        }
        path = job / f"node{node}" / f"rank{rank}" / rundir.LIVE_INFLIGHT
        path.write_text(json.dumps(doc))
    snap = live.LiveMonitor(job, stuck_after_s=5).refresh().snapshot
    (stuck,) = snap.stuck
    assert stuck.arrived == [0, 1, 2] and stuck.missing == [3]
    assert 19 <= stuck.waiting_s < 21  # read as written, rank 2 would add 4 s


def test_a_failed_or_hung_node_makes_the_job_failed_or_hung(job: Path) -> None:
    monitor = live.LiveMonitor(job)
    assert monitor.refresh().snapshot.state == "running"
    path = job / "node1" / "manifest.node1.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(dict(manifest, status="failed", exit_code=1, failed_ranks=[3])))
    snap = monitor.refresh().snapshot
    assert snap.state == "failed" and snap.failed_ranks == [3]
    path.write_text(json.dumps(manifest))
    # node 1's watchdog fired: its own report, in its own directory
    rundir.hang_report_path(job / "node1", 1).write_text(json.dumps({"stuck": []}))
    assert live.LiveMonitor(job).refresh().snapshot.state == "hang"


def test_a_suspected_hang_left_running_does_not_end_the_watch(job: Path) -> None:
    """`--on-hang auto` (the default) reports a hang it is unsure of and leaves the job
    running (`"ended": false`): `watch` ended (exit 0) on that report while the job went
    on. Now the state is `hang_suspected`, the view goes on, and is `running` again once
    the watchdog removes its report on progress."""
    from gpudiag.cli.watch import ENDED

    monitor = live.LiveMonitor(job)
    assert monitor.refresh().snapshot.state == "running"
    report = rundir.hang_report_path(job / "node1", 1)
    report.write_text(json.dumps({"stuck": [], "ended": False, "not_ended_because": "x"}))
    state = monitor.refresh().snapshot.state
    assert state == "hang_suspected" and state not in ENDED
    report.unlink()
    assert monitor.refresh().snapshot.state == "running"
    report.write_text(json.dumps({"stuck": [], "ended": True}))
    assert monitor.refresh().snapshot.state == "hang"


def test_each_table_is_read_incrementally(job: Path) -> None:
    reader = rundir.open_live(job)
    assert isinstance(reader, rundir.JobLiveReader)
    reader.poll()
    steps = rundir.table_path(job / "node1" / "rank3", rundir.STEPS)
    tail = reader.readers[job / "node1"]._tails[("rank", rundir.STEPS, 3)]
    assert tail.offset == steps.stat().st_size  # the offset is remembered per file
    assert reader.poll().rank_rows[rundir.STEPS][3] == []  # nothing new: nothing read
    last = json.loads(steps.read_text().splitlines()[-1])
    row = dict(last, step=last["step"] + 1, end_ns=last["end_ns"] + 10**6)
    with steps.open("a") as fh:
        fh.write(json.dumps(row) + "\n" + '{"rank": 3, "ste')  # and a torn line
    batch = reader.poll()
    (got,) = batch.rank_rows[rundir.STEPS][3]
    assert got["step"] == row["step"] and got["end_ns"] == row["end_ns"] + OFFSET_NS
    assert all(batch.rank_rows[rundir.STEPS][r] == [] for r in (0, 1, 2))
    assert reader.malformed_rows() == 0  # the torn line is retried, not an error


def test_watch_cli_one_job_and_bad_sets(job: Path) -> None:
    def watch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpudiag", "watch", *args, "--once", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for args in ([str(job)], list(map(str, _dirs(job)))):
        proc = watch(*args)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert [r["node"] for r in data["ranks"]] == [0, 0, 1, 1]
        assert data["lagging"] == [2] and data["state"] == "running"
    proc = watch(str(job / "node0"), str(SAMPLE))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not the per-node directories" in proc.stderr
    proc = watch(str(job / "node0"), str(job / "nothing"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
