"""gpudiag's background threads, named for the operating system too.

Python 3.11 names threads only for Python itself: ``top -H``, ``ps -L`` and
``/proc/<pid>/task/<tid>/comm`` show every thread of a rank as ``python``. Each gpudiag
thread sets its kernel name (15 bytes at most, e.g. ``gpudiag-sampler``) when it
starts, so a user can see what gpudiag runs in their job and ``bench/overhead.py``
can charge each thread's CPU time to the right piece.

Inside the training process gpudiag runs one thread, :class:`Service` (``gpudiag-service``):
its tasks are the launcher-liveness check, the hang-dump request poller and the signal
watch, on a small stack (issue 28, N4: a thread costs a rank its stack and a 64 MiB malloc
arena of address space). The launcher's threads (sampler, watchdog, lint, clock) are
started with :func:`start`.
"""

from __future__ import annotations

import _thread
import ctypes
import ctypes.util
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15
_LIBC: Any = None


def set_os_name(name: str) -> None:
    """Name the calling thread for the kernel (Linux; a no-op elsewhere or on error)."""
    global _LIBC
    if not sys.platform.startswith("linux"):
        return
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _LIBC.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _InProcess(threading.Thread):
    """A gpudiag thread inside the training process: it runs until the process ends.

    A script may join every thread it finds before it exits (``for t in
    threading.enumerate(): t.join()``, as some shutdown code does): a join of this thread
    would wait forever and hang the job, so it returns at once (the thread is a daemon
    and ends with the process). gpudiag stops a task of its own with
    :meth:`Service.remove`, which waits for a run under way."""

    def join(self, timeout: float | None = None) -> None:
        return None


def start(
    target: Callable[..., Any], name: str, args: tuple = (), in_process: bool = False
) -> threading.Thread:
    """Start a daemon thread named ``name`` for Python and for the kernel.
    ``in_process``: it runs inside the training process (see :class:`_InProcess`)."""

    def run() -> None:
        set_os_name(name)
        target(*args)

    kind = _InProcess if in_process else threading.Thread
    thread = kind(target=run, name=name, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------- small stacks

# A thread's stack is address space reserved at its start (ulimit -s: 8 MiB). The
# service runs short loops, file writes, faulthandler's C dumps and a rank's finishing
# on a hang or a signal stuck in C (tables, summary.json, status.json), nothing that
# recurses deeply through C (Python 3.11 keeps Python frames off the C stack): both
# finishings touched 16 KiB of it (pthread_getattr_np + the mapping's Rss, gloo jobs).
STACK_BYTES = 512 << 10
_STACK_LOCK = threading.Lock()
_STARTER = threading.local()


def start_small(thread: threading.Thread) -> None:
    """``thread.start()`` with a stack of ``STACK_BYTES``. threading.stack_size is
    process-wide: it is set only around the ``pthread_create`` of this start, in this
    thread (threading's own start-thread function, wrapped for as long as this start
    takes), so a thread the script starts meanwhile keeps its default stack."""
    name = "_start_new_thread" if hasattr(threading, "_start_new_thread") else None
    name = name or (
        "_start_joinable_thread" if hasattr(threading, "_start_joinable_thread") else None
    )
    if name is None:  # an interpreter whose threading is not as expected: default stack
        thread.start()
        return
    with _STACK_LOCK:
        real = getattr(threading, name)

        def start_new(*args: Any, **kwargs: Any) -> Any:
            if not getattr(_STARTER, "ours", False):
                return real(*args, **kwargs)
            try:
                previous = _thread.stack_size(STACK_BYTES)
            except (ValueError, RuntimeError):  # a platform that cannot size stacks
                return real(*args, **kwargs)
            try:
                return real(*args, **kwargs)
            finally:
                _thread.stack_size(previous)

        setattr(threading, name, start_new)
        _STARTER.ours = True
        try:
            thread.start()
        finally:
            _STARTER.ours = False
            if getattr(threading, name) is start_new:
                setattr(threading, name, real)


# ------------------------------------------------------- the in-process service

STOP = object()  # what a task returns to be taken off the schedule
SERVICE_NAME = "gpudiag-service"


class _Task:
    __slots__ = ("fn", "period_s", "due")

    def __init__(self, fn: Callable[[], object], period_s: float, due: float) -> None:
        self.fn = fn
        self.period_s = period_s
        self.due = due


class Service:
    """gpudiag's one thread inside the training process (issue 28, N4: three threads, a
    stack and a malloc arena each, cost a rank 216 MiB of address space, and a job sized
    to ``ulimit -v`` failed). It runs named periodic tasks (the launcher-liveness check,
    the hang-dump request poller, the signal watch's checks), each ``period_s`` after
    its previous run ended (as a loop that sleeps between runs), and reads a pipe whose
    write end is Python's signal wakeup fd (:mod:`gpudiag.capture.signal_watch`): a
    signal is seen the moment it arrives, as by a thread blocked in ``read``. A byte 0
    on the pipe only wakes the loop (a task added or moved). Tasks run one at a time; a
    task never sleeps (it schedules a later run instead)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._tasks: dict[str, _Task] = {}
        self._running: str | None = None
        self._on_signals: Callable[[list[int]], None] | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # where no pipe could be made (no fd left)
        try:
            self._read_fd, self._write_fd = os.pipe()
            os.set_blocking(self._write_fd, False)
        except OSError:
            self._read_fd = self._write_fd = -1

    def add(
        self, name: str, fn: Callable[[], object], period_s: float, first_in: float = 0.0
    ) -> None:
        """Run ``fn()`` ``first_in`` from now, then ``period_s`` after each run ends,
        until it returns :data:`STOP` or is removed; replaces a task of the same name."""
        with self._lock:
            self._tasks[name] = _Task(fn, period_s, time.monotonic() + first_in)
            self._ensure_thread()
        self.wake()

    def remove(self, name: str, limit_s: float = 2.0) -> None:
        """Take ``name`` off the schedule; when it is running now in the service thread,
        wait (up to ``limit_s``) until that run has ended."""
        deadline = time.monotonic() + limit_s
        with self._lock:
            self._tasks.pop(name, None)
            if self._thread is threading.current_thread():
                return
            while self._running == name:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._tasks

    def signal_fd(self, on_signals: Callable[[list[int]], None]) -> int:
        """The write end to hand to ``signal.set_wakeup_fd`` (-1: none could be made);
        ``on_signals(signums)`` then runs in the service thread as signals arrive."""
        if self._write_fd < 0:
            return -1
        with self._lock:
            self._on_signals = on_signals
            self._ensure_thread()
        return self._write_fd

    def wake(self) -> None:
        if self._write_fd < 0:
            self._wake.set()
            return
        try:
            os.write(self._write_fd, b"\0")
        except OSError:  # full: the loop wakes anyway
            pass

    def _ensure_thread(self) -> None:
        if self._thread is None:
            thread = _InProcess(target=self._run_named, name=SERVICE_NAME, daemon=True)
            start_small(thread)
            self._thread = thread

    def _run_named(self) -> None:
        set_os_name(SERVICE_NAME)
        self._loop()

    def _next_timeout(self) -> float | None:
        with self._lock:
            if not self._tasks:
                return None
            return max(0.0, min(t.due for t in self._tasks.values()) - time.monotonic())

    def _wait(self, timeout: float | None) -> list[int]:
        """Until a task is due or a byte arrives: the signal numbers read (0s dropped)."""
        if self._read_fd < 0:
            self._wake.wait(timeout)
            self._wake.clear()
            return []
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        try:
            ready = poller.poll(None if timeout is None else timeout * 1000.0)
        except InterruptedError:
            return []
        if not ready:
            return []
        try:
            data = os.read(self._read_fd, 64)
        except (BlockingIOError, InterruptedError):
            return []
        return [b for b in data if b]

    def _loop(self) -> None:
        while True:
            signums = self._wait(self._next_timeout())
            if signums and self._on_signals is not None:
                try:
                    self._on_signals(signums)
                except Exception:  # noqa: BLE001 - the service must never take the rank down
                    pass
            self._run_due()

    def _run_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = sorted((t.due, name) for name, t in self._tasks.items() if t.due <= now)
        for _, name in due:
            with self._lock:
                task = self._tasks.get(name)
                if task is None:
                    continue
                self._running = name
            try:
                result = task.fn()
            except Exception:  # noqa: BLE001 - a task's failure is its own, not the rank's
                result = None
            with self._lock:
                self._running = None
                if self._tasks.get(name) is task:
                    if result is STOP:
                        del self._tasks[name]
                    else:
                        task.due = time.monotonic() + task.period_s
                self._idle.notify_all()


_SERVICE: Service | None = None
_SERVICE_LOCK = threading.Lock()


def service() -> Service:
    """This process's service (made, and its thread started, at first use)."""
    global _SERVICE
    with _SERVICE_LOCK:
        if _SERVICE is None:
            _SERVICE = Service()
        return _SERVICE


def _forget_service() -> None:
    """A forked child has no service thread: it starts its own if it needs one (the
    parent's tasks, signal pipe and locks are not its own)."""
    global _SERVICE, _SERVICE_LOCK, _STACK_LOCK
    _SERVICE = None
    _SERVICE_LOCK = threading.Lock()
    _STACK_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_service)
