"""Node sampler on this machine (no GPU: NVML absent, host samples only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pynvml
import pytest

from gpudiag import rundir
from gpudiag.capture.sampler import NO_GPU_NOTICE, Sampler, nvlink_rates, nvml_or_none


def _has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = pytest.mark.skipif(_has_nvml(), reason="these tests cover the no-GPU path")


def test_no_gpu_notice_and_host_rows(tmp_path: Path) -> None:
    busy = "print('ready', flush=True)\nwhile True: sum(range(10000))"
    worker = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        # sampled once it runs Python: a sample taken while the child still execs (a CI
        # run: 0.4 MB at the first sample on a loaded machine) is no busy worker's
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        sampler = Sampler(tmp_path, node=0, interval_s=0.05, pids_provider=lambda: [worker.pid])
        before = time.time_ns()
        sampler.start()
        time.sleep(2.0)
        sampler.stop()
        after = time.time_ns()
    finally:
        worker.kill()
        worker.wait()
    assert sampler.kind == "host"
    assert sampler.notice == NO_GPU_NOTICE
    run = rundir.load_run(tmp_path)
    assert run.gpu_samples.empty
    assert not (tmp_path / "node0" / "gpu_samples.jsonl").exists()
    host = run.host_samples
    assert 5 <= len(host) <= 41, len(host)  # fewer on a loaded machine: it skips, never bursts
    assert host["t_ns"].is_monotonic_increasing and host["t_ns"].is_unique
    assert host["t_ns"].between(before, after).all()  # epoch clock, not monotonic
    assert (host["mem_total"] > host["mem_used"]).all() and (host["mem_used"] > 0).all()
    assert host["cpu_percent"].between(0, 100).all()
    # the busy worker is seen: its RSS, and CPU after the first interval (a busy loop gets
    # only a few % of a core when 30 processes share two, so any CPU counts)
    assert (host["proc_rss"] > 1_000_000).all()
    assert host["proc_cpu_percent"].iloc[2:].max() > 0.5


def test_worker_exit_does_not_stop_sampling(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    worker.wait()
    sampler = Sampler(tmp_path, interval_s=0.05, pids_provider=lambda: [worker.pid])
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    host = rundir.load_run(tmp_path).host_samples
    assert len(host) >= 3
    assert host["proc_rss"].isna().all() or (host["proc_rss"] == 0).all()


def test_rows_survive_sampler_process_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import time
        from gpudiag.capture.sampler import Sampler
        s = Sampler({str(tmp_path)!r}, interval_s=0.02)
        s.start()
        print("started", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    path = rundir.table_path(rundir.node_dir(tmp_path, 0), rundir.HOST_SAMPLES)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 2000):
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no flush, no atexit
    proc.wait()
    run = rundir.load_run(tmp_path)
    assert len(run.host_samples) >= 10
    assert run.host_samples["t_ns"].is_monotonic_increasing
    # at most the row being written when killed is torn (and skipped by the reader)
    assert all("malformed" in w for w in run.warnings), run.warnings


def test_unsupported_counter_is_null() -> None:
    def unsupported() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    assert nvml_or_none(unsupported) is None
    assert nvml_or_none(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):  # only NVML errors become null
        nvml_or_none(lambda: 1 / 0)


def _fields(t_us: int, tx_kib: int, rx_kib: int, status: int = 0) -> object:
    """NVML's own field-value structs, filled as nvmlDeviceGetFieldValues fills them."""
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    for field, kib in zip(values, (tx_kib, rx_kib), strict=True):
        field.nvmlReturn, field.valueType, field.timestamp = status, 3, t_us
        field.value.ullVal = kib
    return values


def test_nvlink_rate_from_cumulative_counters() -> None:
    prev: dict[int, tuple] = {}
    assert nvlink_rates(_fields(1_000_000, 5_000, 7_000), 0, prev) == (None, None)  # first
    assert nvlink_rates(_fields(1_250_000, 6_000, 7_000), 0, prev) == (4000.0, 0.0)
    # a GPU without NVLink reports an error per field: null, never an exception
    unsupported = _fields(1_500_000, 0, 0, status=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert nvlink_rates(unsupported, 1, prev) == (None, None)
    assert nvlink_rates(None, 2, prev) == (None, None)
