"""Multi-node pieces without a job: the clock exchange over a real TCPStore on
127.0.0.1, and which directories the reader merges into one run."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpudiag import rundir
from gpudiag.capture import clock


def test_clock_exchange_over_a_tcpstore_finds_no_offset_on_one_host() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    records: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    threads = [clock.start(server, node, 2, records[node].append, timeout_s=30) for node in (0, 1)]
    for t in threads:
        t.join(timeout=60)
    node0, node1 = records[0][-1], records[1][-1]
    assert "error" not in node0 and "error" not in node1, (node0, node1)
    assert node0["offset_ns"] == 0 and node0["answered"] == clock.ROUNDS
    assert node1["job_id"] == node0["job_id"] and node1["rounds"] == clock.ROUNDS
    # one clock: the true offset is 0, and the estimate is within its own bound
    assert abs(node1["offset_ns"]) <= max(node1["uncertainty_ns"], 1_000_000), node1


def test_clock_exchange_failure_is_recorded_not_raised() -> None:
    got: list[dict[str, Any]] = []
    clock.exchange(object(), 1, 2, got.append, timeout_s=1)
    assert got and got[-1]["offset_ns"] is None and "not a TCPStore" in got[-1]["error"]


def _node_dir(path: Path, node: int, job_id: str, start_ns: int, offset_ns: int = 0) -> Path:
    path.mkdir(parents=True)
    manifest = {
        "format_version": 1,
        "node_rank": node,
        "nnodes": "2",
        "status": "ok",
        "start_ns": start_ns,
        "end_ns": start_ns + 10**9,
        "world_size": 2,
        "hosts": [{"hostname": f"h{node}", "node_rank": node}],
        "clock": {"job_id": job_id, "offset_ns": offset_ns, "method": clock.METHOD},
    }
    name = rundir.MANIFEST if node == 0 else f"manifest.node{node}.json"
    (path / name).write_text(json.dumps(manifest))
    rank = node  # one rank per node
    rdir = rundir.rank_dir(path, rank)
    rdir.mkdir()
    (rdir / rundir.RANK_INFO).write_text(json.dumps({"rank": rank, "node_rank": node}))
    step = {"step": 0, "start_ns": start_ns, "end_ns": start_ns + 5, "source": "api"}
    rundir.table_path(rdir, rundir.STEPS).write_text(json.dumps(step) + "\n")
    return path


def test_per_node_directories_of_one_job_merge_with_the_clock_applied(tmp_path: Path) -> None:
    t = time.time_ns()
    _node_dir(tmp_path / "a", 0, "job1", t)
    _node_dir(tmp_path / "b", 1, "job1", t + 7_000, offset_ns=-7_000)
    assert rundir.node_parts(tmp_path) == [tmp_path / "a", tmp_path / "b"]
    run = rundir.load_run(tmp_path)
    assert run.ranks == [0, 1] and run.rank_nodes == {0: 0, 1: 1}
    assert run.clock_offsets == {1: -7_000}
    assert run.steps.sort_values("rank")["start_ns"].tolist() == [t, t]
    assert [h["hostname"] for h in run.manifest["hosts"]] == ["h0", "h1"]
    assert set(run.manifest["nodes"]) == {1}


def test_a_node_killed_before_its_manifest_got_the_job_id_still_merges(tmp_path: Path) -> None:
    """Issue 28: node 1's launcher was SIGKILLed while its manifest still said `running`
    without the clock; the job id is in node1/clock.json, which it wrote at start-up."""
    t = time.time_ns()
    _node_dir(tmp_path / "a", 0, "job1", t)
    b = _node_dir(tmp_path / "b", 1, "job1", t + 7_000)
    manifest = json.loads((b / "manifest.node1.json").read_text())
    clock_doc = manifest.pop("clock")
    manifest.update(status="running", end_ns=None)
    (b / "manifest.node1.json").write_text(json.dumps(manifest))
    rundir.write_json_atomic(rundir.node_dir(b, 1) / rundir.CLOCK, clock_doc)
    assert rundir.node_parts(tmp_path) == [tmp_path / "a", b]
    assert rundir.load_run(tmp_path).ranks == [0, 1]


def test_other_jobs_are_not_merged(tmp_path: Path) -> None:
    t = time.time_ns()
    _node_dir(tmp_path / "x" / "a", 0, "job1", t)
    _node_dir(tmp_path / "x" / "b", 1, "job2", t)  # another job id
    _node_dir(tmp_path / "y" / "a", 0, "job1", t)
    _node_dir(tmp_path / "y" / "b", 1, "job1", t + 5 * 10**9)  # did not run at the same time
    _node_dir(tmp_path / "z" / "a", 0, "job1", t)
    _node_dir(tmp_path / "z" / "b", 0, "job1", t)  # the same node twice
    for parent in ("x", "y", "z"):
        assert rundir.node_parts(tmp_path / parent) == []
        assert len(rundir.group_node_dirs(sorted((tmp_path / parent).iterdir()))) == 2


def test_an_implausible_clock_offset_is_refused(tmp_path: Path) -> None:
    t = time.time_ns()
    _node_dir(tmp_path / "a", 0, "job1", t)
    _node_dir(tmp_path / "b", 1, "job1", t, offset_ns=30 * 24 * 3600 * 10**9)
    run = rundir.load_run(tmp_path)
    assert run.clock_offsets == {}
    assert any("implausible" in w for w in run.warnings)


def test_each_trace_task_carries_only_its_own_clock_offset(shared_traces: Path) -> None:
    """A node's clock offset reaches the per-rank task of each of its traces, and only
    that offset: every file's offsets in every task grew with ranks x ranks (4096 ranks:
    ~400 kB in each of 4096 tasks). Recorded traces; offsets as a merged run gives them."""
    import functools

    from gpudiag.analysis import ingest, pipeline

    files = rundir.find_traces(shared_traces / "param_dlrm_ddp8")
    offsets = {str(p): 1_000 * (i + 1) for i, p in enumerate(files) if i % 2}
    jobs: list[ingest.LoadJob] = []

    def recorded(task: Any, given: list[ingest.LoadJob]) -> Any:
        jobs.extend(given)
        for i, job in enumerate(given):
            yield i, task(job)

    traces = ingest.load_traces(
        files, warnings=[], prepare_for=pipeline._prepare_for(offsets), run_tasks=recorded
    )
    assert len(jobs) == len(files) == len(traces)
    for path, job in zip(files, jobs, strict=True):
        prepare = job[2]
        if str(path) in offsets:
            assert isinstance(prepare, functools.partial)
            assert prepare.keywords == {"clock_offset_ns": offsets[str(path)]}
        else:
            assert prepare is pipeline.prepare_rank
    shifted = {str(t.meta.path): t.cache.get("clock_offset_ns") for t in traces}
    assert shifted == {str(p): offsets.get(str(p)) for p in files}
