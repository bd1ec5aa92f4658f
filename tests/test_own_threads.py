"""gpudiag's own thread inside a traced rank (issue 28, N4): one service thread runs the
launcher-liveness check, the hang-dump poller and the signal watch, on a small stack.
Three threads, each with an 8 MiB stack and a 64 MiB malloc arena, had cost a rank
216 MiB of address space: a job sized to ``ulimit -v`` failed only under gpudiag."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudiag.capture import signal_watch, threads

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "own_threads.py"
# One thread's malloc arena reserves 64 MiB of address space (glibc's HEAP_MAX_SIZE on
# 64-bit), its stack STACK_BYTES; the rest of gpudiag in a rank (modules, the run's
# open files) measured ~4.5 MiB: a rank traced with --no-profile was 69 MiB above plain
# python (before: 218 MiB, three threads). A second thread of gpudiag's (>= 64.5 MiB
# more) cannot fit under the bound; VmSize does not depend on the host's load.
VMSIZE_BOUND_KIB = 100 * 1024


def _wait(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_tasks_run_on_their_own_periods_until_they_stop() -> None:
    runs: dict[str, list[float]] = {"fast": [], "slow": []}

    def task(name: str, last: int):  # type: ignore[no-untyped-def]
        def run() -> object:
            runs[name].append(time.monotonic())
            return threads.STOP if len(runs[name]) >= last else None

        return run

    service = threads.service()
    service.add("test fast", task("fast", 6), 0.05)
    service.add("test slow", task("slow", 2), 0.25)
    assert _wait(lambda: not service.has("test fast") and not service.has("test slow"))
    assert len(runs["fast"]) == 6 and len(runs["slow"]) == 2
    assert runs["slow"][1] - runs["slow"][0] >= 0.25
    assert min(b - a for a, b in zip(runs["fast"], runs["fast"][1:], strict=False)) >= 0.05
    names = [t.name for t in threading.enumerate() if t.name.startswith("gpudiag")]
    assert names == [threads.SERVICE_NAME]


def test_remove_waits_for_a_run_under_way_and_a_join_returns_at_once() -> None:
    started, ended = threading.Event(), threading.Event()

    def slow() -> object:
        started.set()
        time.sleep(0.3)  # a task never sleeps; here it stands for a long write
        ended.set()
        return None

    service = threads.service()
    service.add("test slow write", slow, 10.0)
    assert started.wait(10)
    service.remove("test slow write", 5.0)
    assert ended.is_set() and not service.has("test slow write")
    thread = next(t for t in threading.enumerate() if t.name == threads.SERVICE_NAME)
    begin = time.monotonic()
    thread.join()  # a script that joins every thread must not hang on gpudiag's
    assert time.monotonic() - begin < 1.0 and thread.is_alive()


def test_service_thread_has_a_small_stack_and_the_default_is_kept() -> None:
    seen: list[int] = []

    def probe() -> None:
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        libc.pthread_getattr_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
        libc.pthread_attr_getstacksize.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        attr = ctypes.create_string_buffer(128)
        size = ctypes.c_size_t()
        libc.pthread_getattr_np(libc.pthread_self(), attr)
        libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
        seen.append(size.value)

    thread = threads._InProcess(target=probe, daemon=True)
    threads.start_small(thread)
    threading.Thread.join(thread, 10)
    other = threading.Thread(target=probe)
    other.start()
    other.join(10)
    assert seen[0] <= threads.STACK_BYTES + 64 * 1024
    assert seen[1] > threads.STACK_BYTES  # the script's threads keep the default
    assert threading.stack_size() == 0
    assert threading._start_new_thread is __import__("_thread").start_new_thread  # type: ignore[attr-defined]


def test_a_signal_on_the_wakeup_pipe_is_watched_in_the_service(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The service reads Python's signal wakeup pipe: a signal whose handler is ours and
    a main thread that stays put (a C call) call on_stuck after act_s, not before; a
    main thread that moves does not."""
    stuck: list[tuple[int, float]] = []
    monkeypatch.setattr(signal_watch, "_main_position", lambda: (1, 2))
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    watch = signal_watch.SignalWatch(
        lambda s: stuck.append((s, time.monotonic())),
        lambda s: s == signal.SIGUSR2,
        act_s={signal.SIGUSR2: 0.4},
    )
    try:
        assert watch.start()
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert _wait(lambda: bool(stuck))
        assert stuck[0][0] == signal.SIGUSR2 and stuck[0][1] - sent >= 0.4
        positions = iter(range(10**6))
        monkeypatch.setattr(signal_watch, "_main_position", lambda: (next(positions), 0))
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(1.0)
        assert len(stuck) == 1
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR2, previous)


def test_a_forked_child_runs_no_service_of_its_parent() -> None:
    threads.service().add("test parent only", lambda: None, 0.2)
    pid = os.fork()
    if pid == 0:  # the child: no service thread, no parent's task; it may start its own
        ok = threads._SERVICE is None and not any(
            t.name == threads.SERVICE_NAME for t in threading.enumerate()
        )
        ran = threading.Event()
        threads.service().add("test child", lambda: (ran.set(), threads.STOP)[1], 0.1)
        os._exit(0 if ok and ran.wait(5) and not threads.service().has("test parent only") else 1)
    _, status = os.waitpid(pid, 0)
    threads.service().remove("test parent only")
    assert os.waitstatus_to_exitcode(status) == 0


def _own_threads(cmd: list[str], tmp_path: Path) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("OWN_THREADS ")]
    assert out.returncode == 0 and lines, out.stdout + out.stderr
    return json.loads(lines[0].split(" ", 1)[1])


@pytest.mark.slow
def test_a_traced_rank_runs_one_gpudiag_thread_on_a_small_stack(tmp_path: Path) -> None:
    plain = _own_threads([sys.executable, str(SCRIPT)], tmp_path)
    traced = _own_threads(
        [
            sys.executable,
            "-m",
            "gpudiag",
            "trace",
            "--no-profile",
            "--no-lint",
            "--out",
            str(tmp_path / "run"),
            str(SCRIPT),
        ],
        tmp_path,
    )
    assert [n for n in traced["python"] if n != "MainThread"] == [threads.SERVICE_NAME]
    assert traced["kernel_gpudiag"] == [threads.SERVICE_NAME]
    assert all(
        s is not None and s <= threads.STACK_BYTES // 1024 + 64 for s in traced["stacks_kib"]
    )
    grown = traced["vmsize_kib"] - plain["vmsize_kib"]
    assert grown < VMSIZE_BOUND_KIB, (plain, traced)


def test_the_finishing_deadline_timer_starts_on_a_small_stack(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The finishing's deadline (worker_exit._exit_after) starts a timer thread: on a
    small stack too, and a start that fails (no address space left under ulimit -v) does
    not stop the finishing."""
    from gpudiag.capture import worker_exit

    started: list[threading.Thread] = []
    real = threads.start_small

    def record(thread: threading.Thread) -> None:
        started.append(thread)
        real(thread)

    monkeypatch.setattr(threads, "start_small", record)
    worker_exit._exit_after(600.0, 0)
    (timer,) = started
    assert isinstance(timer, threading.Timer) and timer.daemon
    timer.cancel()

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threads, "start_small", refuse)
    worker_exit._exit_after(600.0, 0)  # no exception
