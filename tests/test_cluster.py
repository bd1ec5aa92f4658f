"""`gpudiag analyze --scheduler`: ingest and the per-rank analyses on a Dask cluster.

Real processes on 127.0.0.1: a `dask scheduler` and `dask worker`s started here (python
-m distributed.cli.dask_scheduler / dask_worker, the `dask scheduler` / `dask worker`
commands), or a LocalCluster (`--scheduler local:N`). The results must be the local
pool's, key by key, on every trace set in ../shared/traces and every sample run; a
worker killed mid-analysis costs time, not results.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.paths import sample_runs_dir
from gpudiag.report.jsonout import dumps

pytest.importorskip("distributed", reason="the [cluster] extra (pip install 'gpudiag[cluster]')")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCALE = REPO / "bench" / "scale.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
START_TIMEOUT_S = 120  # a loaded 2-core machine starts Python processes slowly


@dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)

    def stop(self) -> None:
        for proc in [*self.workers.values(), self.scheduler]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.workers.values(), self.scheduler]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start_scheduler(tmp: Path) -> tuple[str, subprocess.Popen]:
    sched_file = tmp / "scheduler.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
        + ["--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "scheduler.log").open("w"),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if sched_file.exists():
            try:
                return json.loads(sched_file.read_text())["address"], proc
            except (json.JSONDecodeError, KeyError):
                pass  # being written
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"dask scheduler did not start: {(tmp / 'scheduler.log').read_text()}")


def _worker_command(address: str, name: str) -> list[str]:
    return [sys.executable, "-m", "distributed.cli.dask_worker", address, "--name", name] + [
        "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
    ]  # fmt: skip


def _wait_for_workers(address: str, n: int) -> None:
    from distributed import Client

    with Client(address, timeout=START_TIMEOUT_S) as client:
        client.wait_for_workers(n, timeout=START_TIMEOUT_S)


def _start_cluster(
    tmp: Path, names: list[str], wrap: Callable[[list[str]], list[str]] | None = None
) -> Cluster:
    tmp.mkdir(parents=True, exist_ok=True)
    address, scheduler = _start_scheduler(tmp)
    cluster = Cluster(address, scheduler)
    try:
        for name in names:
            cmd = _worker_command(address, name)
            if wrap is not None:
                cmd = wrap(cmd)
            cluster.workers[name] = subprocess.Popen(
                cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=(tmp / f"{name}.log").open("w")
            )
        _wait_for_workers(address, len(names))
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = _start_cluster(tmp_path_factory.mktemp("dask"), ["w0", "w1"])
    try:
        yield c
    finally:
        c.stop()


def _trace_sets(shared_traces: Path) -> list[Path]:
    sets = sorted(p for p in shared_traces.iterdir() if p.is_dir() and rundir.find_traces(p))
    return sets + rundir.sample_run_paths(sample_runs_dir())


def _assert_same_json(local: dict[str, Any], remote: dict[str, Any], where: Path) -> None:
    assert list(remote) == list(local), where
    for key in local:  # key by key; dumps so NaN equals NaN
        assert dumps(remote[key]) == dumps(local[key]), f"{where}: {key} differs"


def test_cluster_results_equal_the_local_pool_on_every_trace_set(
    cluster: Cluster, shared_traces: Path
) -> None:
    from gpudiag.analysis.dask_tasks import connect

    sets = _trace_sets(shared_traces)
    assert len(sets) >= 9  # 6 foreign trace sets, 3 sample runs
    with connect(cluster.address) as tasks:
        for path in sets:
            local = analyze(path)
            remote = analyze(path, run_tasks=tasks)
            _assert_same_json(local.to_json(), remote.to_json(), path)
            # only the per-rank results came back, not the event tables
            assert remote.traces and all(t.events_dropped for t in remote.traces), path
            assert len(remote.timeline()) == len(local.timeline()), path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", *args],
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_cli_scheduler_and_local_cluster_print_the_local_json(cluster: Cluster) -> None:
    run = sample_runs_dir() / "ddp4_straggler"
    local = _cli(str(run), "--json")
    remote = _cli(str(run), "--json", "--scheduler", cluster.address)
    in_process = _cli(str(run), "--json", "--scheduler", "local:2")
    assert local.returncode == remote.returncode == in_process.returncode == 0, (
        remote.stderr + in_process.stderr
    )
    assert remote.stdout == local.stdout
    assert in_process.stdout == local.stdout
    straggler = [f for f in json.loads(remote.stdout)["findings"] if f["kind"] == "straggler"]
    assert straggler and straggler[0]["ranks"] == [2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_scheduler_is_a_one_line_error() -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    run = sample_runs_dir() / "ddp2_healthy"
    out = _cli(str(run), "--scheduler", address, env={**ENV, "GPUDIAG_SCHEDULER_TIMEOUT": "3"})
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpudiag: error:")]
    assert len(errors) == 1, out.stderr
    assert f"cannot reach the Dask scheduler at {address}" in errors[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("spec", ["local:0", "local:x"])
def test_bad_local_spec_is_a_one_line_error(spec: str) -> None:
    out = _cli(str(sample_runs_dir() / "ddp2_healthy"), "--scheduler", spec)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"gpudiag: error: --scheduler {spec}: expected local:N with N >= 1 workers"
    ]


def test_without_distributed_the_error_names_the_extra() -> None:
    """The import system itself refuses `distributed` (sys.modules entry None)."""
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from gpudiag.cli import main\n"
        f"sys.exit(main(['analyze', {str(sample_runs_dir() / 'ddp2_healthy')!r}, "
        "'--scheduler', 'tcp://127.0.0.1:8786']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gpudiag: error: --scheduler needs Dask's distributed package, which is not "
        "installed: pip install 'gpudiag[cluster]'"
    ]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs none /mnt"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -m (a private mount namespace)")
def test_worker_that_cannot_see_the_traces_is_named(tmp_path: Path) -> None:
    """The worker runs in its own mount namespace where an empty tmpfs hides the run
    directory: a worker without the shared filesystem. One line names it and the file."""
    run = tmp_path / "run"
    shutil.copytree(sample_runs_dir() / "ddp2_healthy", run)

    def hide_run(cmd: list[str]) -> list[str]:
        inner = f"mount -t tmpfs none {shlex.quote(str(run))} && exec {shlex.join(cmd)}"
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]

    cluster = _start_cluster(tmp_path / "dask", ["blind"], wrap=hide_run)
    try:
        out = _cli(str(run), "--scheduler", cluster.address)
    finally:
        cluster.stop()
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpudiag: error:")]
    assert len(errors) == 1, out.stderr
    assert "gpudiag: error: Dask worker tcp://127.0.0.1:" in errors[0]
    assert f"cannot read {run / 'traces'}/rank" in errors[0]
    assert "(no such file)" in errors[0] and "shared by every worker" in errors[0]
    assert "Traceback" not in out.stderr


def _scale_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpudiag_bench_scale", SCALE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_killed_mid_analysis_changes_nothing(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """24 ranks (copies of the recorded ddp4_straggler traces, rank fields rewritten) on
    two workers; one is SIGKILLed while it holds tasks. Dask runs them again on the other
    worker: every rank is analysed and the JSON is the local pool's."""
    from distributed import Client

    from gpudiag.analysis.dask_tasks import connect

    traces = tmp_path / "traces"
    _scale_module().write_rank_copies(
        sorted((sample_runs_dir() / "ddp4_straggler" / "traces").iterdir()), traces, 24
    )
    cluster = _start_cluster(tmp_path_factory.mktemp("dask-kill"), ["victim", "survivor"])
    try:
        with connect(cluster.address) as tasks, Client(cluster.address) as watch:
            box: dict[str, Any] = {}

            def run() -> None:
                try:
                    box["result"] = analyze(traces, run_tasks=tasks)
                except BaseException as exc:  # noqa: BLE001 - reported by the assert below
                    box["error"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            victim = _address_of(watch, "victim")
            deadline = time.monotonic() + START_TIMEOUT_S
            while not watch.processing(workers=[victim]).get(victim):
                assert thread.is_alive() and time.monotonic() < deadline, "no task reached it"
                time.sleep(0.05)
            assert thread.is_alive()
            os.kill(cluster.workers["victim"].pid, signal.SIGKILL)
            thread.join(timeout=600)
            assert not thread.is_alive()
            assert "error" not in box, box.get("error")
            assert victim not in watch.scheduler_info()["workers"]
    finally:
        cluster.stop()
    remote = box["result"]
    assert sorted(remote.ranks["rank"]) == list(range(24))
    _assert_same_json(analyze(traces).to_json(), remote.to_json(), traces)


def test_tasks_in_flight_stay_within_a_window(cluster: Cluster, tmp_path: Path) -> None:
    """40 ranks on 2 workers: the scheduler never holds more than the window of
    per-rank tasks (DaskTasks sends one more as each result comes), and the JSON is
    still the local pool's."""
    from distributed import Client

    from gpudiag.analysis import dask_tasks as dask_cluster

    traces = tmp_path / "traces"
    _scale_module().write_rank_copies(
        sorted((sample_runs_dir() / "ddp4_straggler" / "traces").iterdir()), traces, 40
    )
    held: list[int] = []
    with dask_cluster.connect(cluster.address) as tasks, Client(cluster.address) as watch:
        window = tasks._window()
        assert window < 40

        def watched(task: Any, jobs: list[Any]) -> Iterator[tuple[int, Any]]:
            for arrival in tasks(task, jobs):
                held.append(
                    watch.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
                )
                yield arrival

        remote = analyze(traces, run_tasks=watched)
    assert len(held) == 40
    assert 1 < max(held) <= window, held
    _assert_same_json(analyze(traces).to_json(), remote.to_json(), traces)


def _address_of(client: Any, name: str) -> str:
    workers = client.scheduler_info()["workers"]
    return next(addr for addr, info in workers.items() if info.get("name") == name)
