"""`gpudiag watch` over a multi-node job written as one directory per node, while it
runs: two `gpudiag trace` launchers on 127.0.0.1 act as two nodes of 2 gloo ranks each
(as in test_multinode.py), each with its own --out. The watch of both directories (or
of their parent; and the dashboard's live page of that parent) is one view of the job:
the slow rank on node 1 is lagging, and a rank on node 1 that stops calling collectives
is missing from the stuck collective that ranks of both nodes entered, before the hang
watchdog ends the job.

Node 1's clock runs 5 s behind (the test-only shift): read as written, its ranks would
seem 5 s late to every collective and 5 s idle since their last step; the watch puts
them on node 0's clock as the loader does.

Real processes on a loaded 2-core machine: generous deadlines, every condition polled
for, nothing asserted on a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "live_job.py"
APP = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"
DEADLINE_S = 300  # 4 ranks and 2 launchers start slowly on 2 shared cores
TARGET = 3  # local rank 1 of node 1
SHIFT_NS = -5_000_000_000  # node 1's clock 5 s behind node 0's


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_job(job: Path, mode: str, stop: Path) -> list[subprocess.Popen[str]]:
    port = _free_port()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--no-profile",
            "--hang-timeout", "600", "--out", str(job / f"node{node}"),
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(SCRIPT), mode, str(stop), "3000", str(TARGET),
        ]  # fmt: skip
        env = {**os.environ}
        if node == 1:
            env["GPUDIAG_TEST_CLOCK_SHIFT_NS"] = str(SHIFT_NS)
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env=env,
            )
        )
    return procs


def _dirs(job: Path) -> list[Path]:
    return [job / "node0", job / "node1"]


# What `watch` says of per-node folders before node 1 knows the job id node 0 published
# (its clock exchange at start-up): a loaded CI host watched that early once.
NOT_ONE_JOB_YET = "not the per-node directories of one job"
FIXTURE = Path(__file__).parent / "fixtures" / "per_node_dirs"


def _watch(paths: list[Path], *extra: str, starting: bool = False) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", *map(str, paths), "--once", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if starting and proc.returncode != 0 and NOT_ONE_JOB_YET in proc.stderr:
        return {}
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _manifests_written(job: Path) -> bool:
    return (job / "node0" / "manifest.json").is_file() and (
        job / "node1" / "manifest.node1.json"
    ).is_file()


def _watch_until(
    job: Path, procs: list[subprocess.Popen[str]], done: Callable[[dict], bool], *extra: str
) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    snap: dict = {}
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if not _manifests_written(job):
            time.sleep(0.5)
            continue
        snap = _watch(_dirs(job), *extra, starting=True)
        if snap and done(snap):
            return snap
        time.sleep(1.0)
    _end(procs)
    pytest.fail(f"watch never saw it; last snapshot {snap}; output {_output(procs)}")


def _end(procs: list[subprocess.Popen[str]], sig: int = signal.SIGKILL) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def _output(procs: list[subprocess.Popen[str]]) -> str:
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            out = ""
        outs.append((out or "")[-1500:])
    return "\n---\n".join(outs)


def _dashboard_until(at: AppTest, procs: list[subprocess.Popen[str]], what: str) -> None:
    """Rerun the app until its live page names ``what`` lagging (the panel's text)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if any(w.value.startswith(what) for w in at.warning):
            return
        time.sleep(1.0)
    _end(procs)
    pytest.fail(f"the dashboard never showed {what!r}; output {_output(procs)}")


def test_watch_per_node_dirs_names_the_slow_rank_and_its_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gpudiag watch` of both directories and of their parent, and the dashboard's live
    page of the parent, while the job runs; the merged post-mortem once it ended."""
    job, stop = tmp_path / "job", tmp_path / "stop"
    procs = _start_job(job, "slow", stop)
    at = None
    try:
        snap = _watch_until(job, procs, lambda s: bool(s["lagging"]) and len(s["ranks"]) == 4)
        assert snap["state"] == "running"
        assert snap["lagging"] == [TARGET]
        by_rank = {r["rank"]: r for r in snap["ranks"]}
        assert {r: v["node"] for r, v in by_rank.items()} == {0: 0, 1: 0, 2: 1, 3: 1}
        assert [n["node"] for n in snap["nodes"]] == [0, 1]  # each node's host samples
        for r in by_rank.values():
            assert r["step"] is not None and r["steps_per_s"] > 0
        # on node 0's clock: node 1's ranks are not 5 s behind (as written they are)
        since0 = min(by_rank[r]["since_last_step_s"] for r in (0, 1))
        for r in (2, 3):
            assert by_rank[r]["since_last_step_s"] < since0 + 3.0, snap["ranks"]
        assert snap["stuck"] == []
        # the parent of the two directories is the same job
        parent = _watch([job])
        assert {r["rank"]: r["node"] for r in parent["ranks"]} == {0: 0, 1: 0, 2: 1, 3: 1}
        assert parent["state"] == "running"

        # the dashboard, its root holding the job's parent: one live run
        monkeypatch.setattr(sys, "argv", ["app.py", str(tmp_path)])
        at = AppTest.from_file(str(APP), default_timeout=180)
        _dashboard_until(at, procs, f"Lagging: rank {TARGET} (node 1) over")
        # the run select is keyed by the set of live runs: the first select of the sidebar
        assert at.sidebar.selectbox[0].value == f"{tmp_path.name}/job"
        assert at.header[0].value.startswith("Live")
        assert next(m.value for m in at.metric if m.label == "State") == "running"
        table = at.table[0].value
        assert list(table["node"]) == ["0", "0", "1", "1"]
        assert list(table["lagging"]) == ["no", "no", "no", "lagging"]
    finally:
        stop.write_text("stop")
        for p in procs:
            try:
                p.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                _end(procs)
    assert [p.returncode for p in procs] == [0, 0], _output(procs)
    done = _watch(_dirs(job))
    assert done["state"] == "ok" and done["failed_ranks"] == []
    assert {r["status"] for r in done["ranks"]} == {"ok"}
    assert at is not None
    at.run()  # the job ended: the merged run's analysis
    assert not at.exception, [e.value for e in at.exception]
    assert at.header[0].value.startswith("Overview")
    assert next(m.value for m in at.metric if m.label == "Status") == "ok"


def test_watch_per_node_dirs_shows_the_stuck_collective_across_nodes(tmp_path: Path) -> None:
    job, stop = tmp_path / "job", tmp_path / "stop"
    procs = _start_job(job, "stuck", stop)
    try:
        snap = _watch_until(job, procs, lambda s: bool(s["stuck"]), "--stuck-after", "3")
        assert snap["state"] == "running"  # the watchdog (600 s) has not fired
        assert not any((d / "hang_report.json").exists() for d in _dirs(job))
        stuck = snap["stuck"][0]
        assert stuck["op"] == "all_reduce"
        assert stuck["arrived"] == [0, 1, 2]  # node 0's ranks and node 1's rank 2
        assert stuck["missing"] == [TARGET]
        assert stuck["waiting_s"] >= 3
        by_rank = {r["rank"]: r for r in snap["ranks"]}
        assert by_rank[TARGET]["node"] == 1
        # on node 0's clock: rank 2 (node 1) entered after rank 0's last step ended; read
        # as written it would seem to have waited 5 s longer
        assert stuck["waiting_s"] <= by_rank[0]["since_last_step_s"] + 2.5, snap
    finally:
        _end(procs, signal.SIGTERM)


def test_watch_waits_while_the_node_directories_do_not_name_one_job_yet(tmp_path: Path) -> None:
    """A node learns node 0's job id in its clock exchange, seconds after both manifests
    exist on a loaded host: `watch` said "not the per-node directories of one job" and
    exited 2 (CI, 2026-12-04). While the launchers run, it waits for them to agree."""
    job = tmp_path / "job"
    shutil.copytree(FIXTURE, job)
    node1 = job / "node1" / "manifest.node1.json"
    manifests = [job / "node0" / "manifest.json", node1]
    real_id = None
    for path in manifests:
        m = json.loads(path.read_text())
        m["status"], m["end_ns"] = "running", None
        if path == node1:
            real_id = m["clock"]["job_id"]
            m["clock"]["job_id"] = "not-known-yet"
        path.write_text(json.dumps(m))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudiag", "watch", str(job / "node0"), str(job / "node1"),
         "--once", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # the ids are made to agree once watch has said it waits (not after a fixed sleep:
    # watch's start-up alone took over 3 s on a loaded host)
    said: list[str] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        said.append(line)
        if not line or "do not name one job yet" in line:
            break
    assert "do not name one job yet" in said[-1], "".join(said)[-2000:]
    m = json.loads(node1.read_text())
    m["clock"]["job_id"] = real_id
    node1.write_text(json.dumps(m))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, ("".join(said) + err)[-2000:]
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1, 2, 3]
