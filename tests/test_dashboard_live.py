"""The dashboard's live mode: a run still being written shows as live (the `gpudiag
watch` snapshot, refreshed in place by a Streamlit fragment) and becomes its post-mortem
view when it ends.

Fast tests use copies of the recorded sample runs marked running by a live launcher (this
test process). The slow ones start real 2-rank gloo jobs with `gpudiag trace`
(tests/scripts/live_job.py) and drive the app with Streamlit's AppTest and, marked
`browser`, the real `gpudiag dashboard` in headless Chromium.
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
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ and tests/browser/ are not installed packages

from dashboards import live_page as dash_live  # noqa: E402
from dashboards import runs as dash_runs  # noqa: E402
from dashboards.views import md  # noqa: E402
from tests.browser.dashboard import free_port  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SAMPLES = REPO / "sample_runs"
JOB = REPO / "tests" / "scripts" / "live_job.py"
DEADLINE_S = 240.0  # a loaded 2-core machine starts torch (and Chromium) slowly
LOADED_MS = 240_000


# --------------------------------------------------------------------------- helpers


def _app(monkeypatch: pytest.MonkeyPatch, roots: list[Path]) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *map(str, roots)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _texts(elements: object) -> list[str]:
    return [e.value for e in elements]  # type: ignore[attr-defined]


def _mark_running(run: Path, pid: int) -> None:
    """The run's manifest as `gpudiag trace` writes it while the job runs."""
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(status="running", end_ns=None, exit_code=None)
    manifest["launcher"] = {"pid": pid, "hostname": socket.gethostname()}
    path.write_text(json.dumps(manifest))
    for status in run.glob("rank*/status.json"):
        status.unlink()


@pytest.fixture
def running_copy(tmp_path: Path) -> Path:
    """sample_runs/ddp4_straggler (rank 2 is slow) as if still being written, under a
    root of its own; its launcher is this test process."""
    root = tmp_path / "live_root"
    run = root / "straggler"
    shutil.copytree(SAMPLES / "ddp4_straggler", run, ignore=shutil.ignore_patterns("traces"))
    _mark_running(run, os.getpid())
    return run


# --------------------------------------------------------------------------- fast


def test_running_run_is_live_and_becomes_its_post_mortem(
    monkeypatch: pytest.MonkeyPatch, running_copy: Path
) -> None:
    root = running_copy.parent
    at = _app(monkeypatch, [root])
    label = "live_root/straggler"
    assert at.sidebar.selectbox[0].value == label
    assert at.header[0].value == f"Live · {md(label)}"
    assert _metric(at, "State") == "running"
    assert _metric(at, "Newest step") == "14"  # the recording's 15 steps (0-14)
    assert _metric(at, "Lagging ranks") == "rank 2"  # analyze's straggler finding on it
    assert any(w.startswith("Lagging: rank 2 over steps") for w in _texts(at.warning))
    # each rank's step time drawn: the snapshot's medians, the lagging rank marked
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    data, rest, late = (t for t in spec["data"] if t["type"] == "bar")
    snap = dash_live.monitor_of(dash_runs.RunRef(label, running_copy.resolve())).refresh().snapshot
    steps = [d + r for d, r in zip(data["y"], rest["y"], strict=True)]
    assert steps == pytest.approx([r.median_step_ms for r in snap.ranks])
    # what tells the lagging rank: how late it arrives at collectives (probe 31j, D8)
    assert late["y"] == pytest.approx([r.late_ms for r in snap.ranks])
    assert max(late["y"]) == late["y"][2]
    bars = data
    assert bars["x"][2] == "rank 2 ◀" and bars["x"][0] == "rank 0"
    ranks = at.table[0].value
    assert list(ranks["rank"]) == ["0", "1", "2", "3"]
    assert list(ranks["lagging"]) == ["no", "no", "lagging", "no"]
    assert list(ranks["step"]) == ["14"] * 4
    assert "host" in list(at.table[1].value["device"])  # the node's host samples
    # One monitor per run, kept between refreshes (its reader remembers the offsets).
    monitor = dash_live.monitor_of(dash_runs.RunRef(label, running_copy.resolve()))
    polls = monitor.polls
    time.sleep(dash_live.MIN_POLL_S + 0.1)
    at.run()
    assert dash_live.monitor_of(dash_runs.RunRef(label, running_copy.resolve())) is monitor
    assert monitor.polls == polls + 1
    assert _metric(at, "Newest step") == "14"

    # The job ends: the next refresh shows the run's post-mortem views.
    manifest = json.loads((running_copy / "manifest.json").read_text())
    manifest.update(status="ok", exit_code=0)
    (running_copy / "manifest.json").write_text(json.dumps(manifest))
    at.run()
    assert not at.exception
    assert at.header[0].value == f"Overview · {md(label)}"
    assert "· status ok ·" in at.caption[0].value.replace("\\", "")
    # and the run select no longer marks it live (a new select, the same run)
    assert at.sidebar.selectbox[0].value == label
    assert at.sidebar.selectbox[0].options == [label]


def test_live_states_failed_rank_and_hung(
    monkeypatch: pytest.MonkeyPatch, running_copy: Path
) -> None:
    """While the launcher still runs: a rank's failed status.json shows as failed with
    that rank, the watchdog's hang_report.json as hung."""
    (running_copy / "rank1" / "status.json").write_text(
        json.dumps({"rank": 1, "status": "failed", "end_ns": time.time_ns()})
    )
    at = _app(monkeypatch, [running_copy.parent])
    assert at.header[0].value.startswith("Live")
    assert _metric(at, "State") == md("failed (rank 1)")
    assert any(e.value == "State: " + md("failed (rank 1)") for e in at.error)
    assert list(at.table[0].value["status"]) == ["–", "failed", "–", "–"]

    (running_copy / "hang_report.json").write_text(json.dumps({"stuck": []}))
    time.sleep(dash_live.MIN_POLL_S + 0.1)
    at.run()
    assert _metric(at, "State") == "hung"


def test_launcher_gone_is_not_live(monkeypatch: pytest.MonkeyPatch, running_copy: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _mark_running(running_copy, dead.pid)
    assert dash_runs.recorded_status(running_copy) == "launcher_lost"
    at = _app(monkeypatch, [running_copy.parent])
    assert at.header[0].value.startswith("Overview")
    assert _metric(at, "Status") == md("launcher_lost")


def test_stuck_collective_and_run_text_escaped(
    monkeypatch: pytest.MonkeyPatch, running_copy: Path
) -> None:
    """A rank in an all-reduce for 60 s that rank 3 never entered; the process group's
    name is Markdown and is shown as text."""
    evil = "![x](http://127.0.0.1:9/x.png) **pg**"
    now = time.time_ns()
    for rank in (0, 1, 2):
        doc = {
            "t_ns": now,
            "inflight": [
                {
                    "pg_name": evil,
                    "seq": 10_000,
                    "op": "all_reduce",
                    "enter_ns": now - 60 * 10**9,
                    "pg_ranks": [0, 1, 2, 3],
                }
            ],
        }
        (running_copy / f"rank{rank}" / "inflight_live.json").write_text(json.dumps(doc))
    at = _app(monkeypatch, [running_copy.parent])
    assert _metric(at, "Stuck collectives") == "1"
    (error,) = [e for e in _texts(at.error) if e.startswith("Stuck")]
    assert md(evil) in error
    # rank numbers that cannot be read as a count ("arrived: 0" did: probe N3)
    want = "arrived (waiting in it): ranks 0, 1, 2 (3 of 4 ranks); never arrived: rank 3"
    assert want in error.replace("\\", "")
    stuck = at.table[1].value
    assert list(stuck["process group"]) == [md(evil)]
    assert [c.replace("\\", "") for c in stuck["ranks already in it"]] == ["ranks 0, 1, 2"]
    assert [c.replace("\\", "") for c in stuck["ranks never arrived"]] == ["rank 3"]


def test_multi_node_run_is_live_while_a_node_writes(
    monkeypatch: pytest.MonkeyPatch, running_copy: Path
) -> None:
    """One run directory, two launchers (manifest.json and manifest.node1.json): live
    while either is still writing; the state is the worst node's."""
    path = running_copy / "manifest.json"
    node0 = json.loads(path.read_text())
    node1 = dict(node0, node_rank=1)
    path.write_text(json.dumps(dict(node0, status="ok", exit_code=0)))
    (running_copy / "manifest.node1.json").write_text(json.dumps(node1))  # still running
    at = _app(monkeypatch, [running_copy.parent])
    assert at.header[0].value.startswith("Live")
    assert _metric(at, "State") == "running"

    # Node 1's launcher ended with rank 3 failed while node 0's is still writing.
    path.write_text(json.dumps(node0))
    node1.update(status="failed", exit_code=1, failed_ranks=[3])
    (running_copy / "manifest.node1.json").write_text(json.dumps(node1))
    time.sleep(dash_live.MIN_POLL_S + 0.1)
    at.run()
    assert at.header[0].value.startswith("Live")
    assert _metric(at, "State") == md("failed (rank 3)")
    assert any(e.value == "State: " + md("failed (rank 3)") for e in at.error)

    path.write_text(json.dumps(dict(node0, status="failed", exit_code=1)))
    at.run()
    assert at.header[0].value.startswith("Overview")
    assert _metric(at, "Status").startswith("failed")


def test_per_node_directories_of_one_job_are_one_live_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A root holding the per-node directories of one running job (each launcher its own
    --out; node 1's clock 5 s behind): one run in the list, live, ranks of both nodes
    with their node, node 1 on node 0's clock; the merged post-mortem when it ends."""
    from tests.live_nodes_split import set_status, split_job

    root = tmp_path / "live_root"
    dirs = split_job(root / "job", 5_000_000_000)
    at = _app(monkeypatch, [root])
    assert at.sidebar.selectbox[0].options == ["● live_root/job (live)"]
    assert at.header[0].value == f"Live · {md('live_root/job')}"
    assert _metric(at, "State") == "running"
    assert _metric(at, "Ranks") == "4"
    assert _metric(at, "Lagging ranks") == "rank 2"  # analyze's straggler, across the nodes
    assert any(w.startswith("Lagging: rank 2 (node 1) over") for w in _texts(at.warning))
    ranks = at.table[0].value
    assert list(ranks["node"]) == ["0", "0", "1", "1"]
    since = [float(x.replace("\\", "").replace(",", "")) for x in ranks["since last step s"]]
    assert max(since) - min(since) < 1.0  # not 5 s apart: one clock
    assert list(at.table[1].value["node"]) == ["0", "1"]  # each node's host

    # Node 1 failed while node 0 still writes: the job is failed, still live.
    node1 = dirs[1] / "manifest.node1.json"
    manifest = json.loads(node1.read_text())
    node1.write_text(json.dumps(dict(manifest, status="failed", exit_code=1, failed_ranks=[3])))
    time.sleep(dash_live.MIN_POLL_S + 0.1)
    at.run()
    assert at.header[0].value.startswith("Live")
    assert _metric(at, "State") == md("failed (rank 3)")

    set_status(dirs, "ok")
    at.run()
    assert not at.exception
    assert at.header[0].value == f"Overview · {md('live_root/job')}"
    assert _metric(at, "Status") == "ok"


# --------------------------------------------------------------------------- real jobs


def _start(run: Path, mode: str, stop: Path, steps: int = 3000) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2",
        "--master-port", str(free_port()), "--no-lint", "--no-profile",
        "--hang-timeout", "600", "--out", str(run), str(JOB), mode, str(stop), str(steps),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _end(job: subprocess.Popen) -> None:
    if job.poll() is None:
        try:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def _output(job: subprocess.Popen) -> str:
    try:
        out, _ = job.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        return ""
    return (out or "")[-2000:]


def _until(what: str, job: subprocess.Popen, check: Callable[[], object]) -> object:
    """``check()``'s first truthy value, polled until DEADLINE_S; fails if the job ends."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if job.poll() is not None:
            pytest.fail(f"the job ended before {what}: {_output(job)}")
        value = check()
        if value:
            return value
        time.sleep(1.0)
    pytest.fail(f"never saw {what} within {DEADLINE_S:.0f} s")


def _running(run: Path) -> bool:
    return run.is_dir() and dash_runs.recorded_status(run) == "running"


@pytest.mark.slow
def test_real_job_live_names_the_slow_rank_then_finished(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root, stop = tmp_path / "jobs", tmp_path / "stop"
    run = root / "slow"
    job = _start(run, "slow", stop)
    try:
        _until("the run marked running", job, lambda: _running(run))
        monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
        at = AppTest.from_file(str(APP), default_timeout=180)

        def lagging_shown() -> bool:
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            return any(w.startswith("Lagging: rank 1 over") for w in _texts(at.warning))

        _until("rank 1 named lagging", job, lagging_shown)
        assert at.header[0].value == f"Live · {md('jobs/slow')}"
        assert _metric(at, "State") == "running"
        assert _metric(at, "Lagging ranks") == "rank 1"
        ranks = at.table[0].value
        assert list(ranks["rank"]) == ["0", "1"]
        assert list(ranks["lagging"]) == ["no", "lagging"]
        assert all(int(s) >= 1 for s in ranks["step"])
    finally:
        stop.write_text("stop")
        try:
            job.wait(timeout=DEADLINE_S)
        finally:
            _end(job)
    assert job.returncode == 0, _output(job)
    at.run()
    assert not at.exception
    assert at.header[0].value == f"Overview · {md('jobs/slow')}"
    assert _metric(at, "Status") == "ok"


@pytest.mark.slow
def test_real_failed_run_shows_its_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    job = _start(root / "fail", "fail", tmp_path / "stop")
    try:
        job.wait(timeout=DEADLINE_S)
    finally:
        _end(job)
    assert job.returncode != 0
    at = _app(monkeypatch, [root])
    assert at.header[0].value == f"Overview · {md('jobs/fail')}"
    assert _metric(at, "Status").startswith("failed")
    failures = [f for f in at.table[0].value.itertuples() if f.kind.startswith("rank")]
    assert failures, at.table[0].value
    assert "1" in failures[0].ranks


@pytest.mark.slow
@pytest.mark.browser
def test_browser_live_page_updates_without_reload(tmp_path: Path) -> None:
    """The step shown rises while the page stays the same document (a marker set in the
    page survives), and when the job ends the page becomes the run's Overview, again
    without a reload."""
    from tests.browser import dashboard as browser

    root, stop = tmp_path / "jobs", tmp_path / "stop"
    run = root / "slow"
    job = _start(run, "slow", stop, steps=100_000)
    server = None
    try:
        _until("the run marked running", job, lambda: _running(run))
        server = browser.Dashboard([root])
        server.wait_ready()
        with browser.browser() as page:
            loads: list[str] = []
            page.on("load", lambda p: loads.append(p.url))
            page.goto(browser.view_url(server.url, "jobs/slow", "Overview"))
            page.wait_for_selector('h2:has-text("Live")', timeout=LOADED_MS)
            step = page.locator('[data-testid="stMetric"]').filter(has_text="Newest step")

            def shown_step() -> int | None:
                text = step.locator('[data-testid="stMetricValue"]').inner_text(timeout=LOADED_MS)
                return int(text) if text.strip().isdigit() else None

            first = _until("a step on the page", job, shown_step)
            page.evaluate("window.__gpudiagMarker = 'same page'")
            loads_before = len(loads)
            later = _until("the step rise", job, lambda: (s := shown_step()) and s > first and s)
            assert page.evaluate("window.__gpudiagMarker") == "same page"
            assert len(loads) == loads_before
            assert later > first
            page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
            # a view clicked during the run is the URL's, across the panel's refreshes (it
            # stayed one click behind: browser probe of issue 31, G). The address the
            # browser shows is read from the page: Playwright's page.url lags one entry
            # behind a history.pushState made while the live panel refreshes (probe D3)
            for view in ("Step breakdown", "Communication"):
                page.locator('[data-testid="stSidebar"] label').filter(has_text=view).click()
                time.sleep(3 * dash_live.REFRESH_S)
                url = page.evaluate("location.href")
                assert f"view={urllib.parse.quote_plus(view)}" in url, (view, url)
            page.locator('[data-testid="stSidebar"] label').filter(has_text="Overview").click()
            time.sleep(3 * dash_live.REFRESH_S)
            url = page.evaluate("location.href")
            assert "view=" not in url or "view=Overview" in url, url

            stop.write_text("stop")
            job.wait(timeout=DEADLINE_S)
            assert job.returncode == 0, _output(job)
            page.wait_for_selector('h2:has-text("Overview")', timeout=LOADED_MS)
            assert page.evaluate("window.__gpudiagMarker") == "same page"
            assert "ended while it was watched live" in page.inner_text("body")
            assert page.locator(browser.EXCEPTION).count() == 0
    finally:
        stop.write_text("stop")
        _end(job)
        if server is not None:
            server.close()


def _append_step(run_dirs: list[Path]) -> int:
    """One more step on every rank of the per-node job (each rank's own clock); the new
    step number."""
    newest = 0
    for steps in sorted(p for d in run_dirs for p in d.glob("rank*/steps.jsonl")):
        last = json.loads(steps.read_text().splitlines()[-1])
        took = last["end_ns"] - last["start_ns"]
        row = dict(last, step=last["step"] + 1)
        row.update(start_ns=last["end_ns"], end_ns=last["end_ns"] + took)
        with steps.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        newest = row["step"]
    return newest


@pytest.mark.slow
@pytest.mark.browser
def test_browser_per_node_job_is_one_live_page(tmp_path: Path) -> None:
    """The per-node directories of one running job (a recorded run split into two node
    directories, tests/live_nodes_split.py) in the real `gpudiag dashboard` in headless
    Chromium: one live page for the job; a step appended on both nodes shows without a
    reload, and when both launchers end the page becomes the merged run's Overview."""
    from tests.browser import dashboard as browser
    from tests.live_nodes_split import set_status, split_job

    root = tmp_path / "live_root"
    dirs = split_job(root / "job", 5_000_000_000)
    server = browser.Dashboard([root])
    try:
        server.wait_ready(timeout_s=DEADLINE_S)
        with browser.browser() as page:
            loads: list[str] = []
            page.on("load", lambda p: loads.append(p.url))
            page.goto(browser.view_url(server.url, "live_root/job", "Overview"))
            page.wait_for_selector('h2:has-text("Live")', timeout=LOADED_MS)
            lagging = page.get_by_text("Lagging: rank 2 (node 1) over", exact=False)
            lagging.first.wait_for(timeout=LOADED_MS)  # the panel draws after the header
            step = page.locator('[data-testid="stMetric"]').filter(has_text="Newest step")
            value = step.locator('[data-testid="stMetricValue"]')
            assert value.inner_text(timeout=LOADED_MS).strip() == "14"
            page.evaluate("window.__gpudiagMarker = 'same page'")
            loads_before = len(loads)
            newest = _append_step(dirs)
            deadline = time.monotonic() + DEADLINE_S
            while value.inner_text(timeout=LOADED_MS).strip() != str(newest):
                assert time.monotonic() < deadline, "the new step never showed"
                time.sleep(0.5)
            assert page.evaluate("window.__gpudiagMarker") == "same page"
            assert len(loads) == loads_before

            set_status(dirs, "ok")
            page.wait_for_selector('h2:has-text("Overview")', timeout=LOADED_MS)
            assert page.evaluate("window.__gpudiagMarker") == "same page"
            assert "ended while it was watched live" in page.inner_text("body")
            assert page.locator(browser.EXCEPTION).count() == 0
            page.screenshot(path=str(tmp_path / "live_nodes.png"), full_page=True)
    finally:
        server.close()
