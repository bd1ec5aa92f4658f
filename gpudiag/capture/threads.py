"""gpudiag's background threads, named for the operating system too.

Python 3.11 names threads only for Python itself: ``top -H``, ``ps -L`` and
``/proc/<pid>/task/<tid>/comm`` show every thread of a rank as ``python``. Each gpudiag
thread sets its kernel name (15 bytes at most, e.g. ``gpudiag-sampler``) when it
starts, so a user can see what gpudiag runs in their job and ``bench/overhead.py``
can charge each thread's CPU time to the right piece.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
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
    and ends with the process). gpudiag waits for one it stopped with
    ``threading.Thread.join(thread, timeout)``."""

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
