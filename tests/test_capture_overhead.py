"""The always-on capture's cheap paths (docs/reliability.md, "Overhead"): named kernel
threads, the job's processes and their exits from /proc, the sampler's /proc reads, the
launcher's wait on a pidfd. Real processes throughout; psutil is the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpudiag.capture import launcher, proctree, threads
from gpudiag.capture.sampler import _ProcStat

LINUX = sys.platform.startswith("linux")
pytestmark = pytest.mark.skipif(not LINUX, reason="/proc and prctl are Linux's")


def test_gpudiag_threads_carry_their_name_in_the_kernel() -> None:
    seen: dict[str, str] = {}
    done = threading.Event()

    def body() -> None:
        tid = threading.get_native_id()
        seen["comm"] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        done.set()

    thread = threads.start(body, "gpudiag-sampler")
    assert done.wait(10)
    thread.join(5)
    assert thread.daemon and thread.name == "gpudiag-sampler"
    assert seen["comm"] == "gpudiag-sampler"


def _tree() -> subprocess.Popen:
    code = (
        "import subprocess,sys,time;"
        "ps=[subprocess.Popen([sys.executable,'-c','import time;time.sleep(60)']) for _ in (0,1)];"
        "q=subprocess.Popen([sys.executable,'-c',"
        '\'import subprocess,sys,time;subprocess.Popen([sys.executable,"-c","import time;time.sleep(60)"]);time.sleep(60)\']);'
        "time.sleep(60)"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def test_job_processes_and_exits_from_proc_match_psutil() -> None:
    proc = _tree()
    try:
        expected: set[int] = set()
        deadline = time.monotonic() + 30
        while len(expected) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
            expected = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        assert len(expected) == 4
        assert set(proctree.descendants(proc.pid)) == expected
        assert all(launcher._alive(pid) for pid in expected)
        victim = min(expected)
        os.kill(victim, 9)
        deadline = time.monotonic() + 10
        while launcher._alive(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not launcher._alive(victim)  # a zombie until its parent reaps it: gone
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    assert not launcher._alive(proc.pid)


def test_sampler_proc_reads_agree_with_psutil() -> None:
    reader = _ProcStat()
    me = psutil.Process()
    try:
        reader.host_row(0, [os.getpid()])
        me.cpu_percent(None)
        end = time.process_time() + 0.3
        while time.process_time() < end:  # busy: this process near 100 % of a core
            pass
        row = reader.host_row(1, [os.getpid(), 2**22 + 7])  # a pid that does not exist
        reference = me.cpu_percent(None)
    finally:
        reader.close()
    vm = psutil.virtual_memory()
    assert row["mem_total"] == vm.total
    assert abs(row["mem_used"] - (vm.total - vm.available)) < 0.2 * vm.total
    assert 0.0 <= row["cpu_percent"] <= 100.0
    # the same busy stretch seen by both (their windows differ by a few calls)
    assert row["proc_cpu_percent"] > 0 and reference > 0
    assert row["proc_cpu_percent"] == pytest.approx(reference, rel=0.5)
    assert row["proc_rss"] == pytest.approx(me.memory_info().rss, rel=0.2)
    assert reader._procs == {}  # closed


def test_launcher_wait_blocks_on_the_job_and_ticks() -> None:
    job = launcher.Job(
        [sys.executable, "-c", "import time,sys;time.sleep(1.0);sys.exit(3)"], dict(os.environ)
    )
    ticks: list[float] = []
    t0 = time.monotonic()
    assert job.wait(on_tick=lambda: ticks.append(time.monotonic())) == 3
    elapsed = time.monotonic() - t0
    # one per TICK_S (0.2 s), not waitpid polling (a loaded machine may skip some)
    assert 2 <= len(ticks) <= elapsed / launcher.TICK_S + 1
    assert job.wait() == 3  # a second wait returns at once
