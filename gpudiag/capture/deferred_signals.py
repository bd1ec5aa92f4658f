"""Ctrl-C and SIGTERM held back while gpudiag's own set-up runs, and delivered when the
user's code starts (the rank's process: :mod:`gpudiag.capture.rank`).

gpudiag's set-up imports torch (1.3-1.6 s) and more of it (torch.distributed's launcher
API, the profiler) before the script's first line. A Ctrl-C forwarded there raised
KeyboardInterrupt wherever Python next ran bytecode: inside torch's import, where C++
calls back into Python (``torch._C._c10d_init`` takes the import lock) and the exception
cannot propagate (std::terminate, SIGABRT: the process died before status.json and rank
0 was blamed for a native crash, probe 28j F2, 2 of 55 runs), or inside one of
gpudiag's guarded set-up steps, which swallowed it as an instrumentation failure and the
job trained on to ``ok`` (the lost Ctrl-C, 4 of 55).

So from the process's first line of gpudiag code to the user's code, a handler that only
notes the signal stands in for the one in place; at the user's code the handler in place
before is put back and a noted signal is raised again (``signal.raise_signal``): the
script sees what plain python gives it, a KeyboardInterrupt before its first line (or
gpudiag's SIGTERM interrupt, :func:`gpudiag.capture.worker_signals.take_sigterm`).

A signal the process inherited as ignored (``cmd &`` in a shell script, ``trap '' INT``,
``nohup``) is left ignored: nothing stands in for it (probe 28j F4).

gpudiag's signal watch (:mod:`gpudiag.capture.signal_watch`) sees the held signal on its
wakeup fd but watches only a signal whose handler is gpudiag's or Python's default, never
this stand-in: a held signal starts no watch, and the signal raised again at the user's
code starts one as any other would (the main thread then moves: nothing is done).

This module imports nothing of gpudiag or torch: it is the rank's first import.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# signal's own functions, before gpudiag hides its handlers from the script
_set_handler = signal.signal
_get_handler = signal.getsignal

_inherited: dict[int, Any] = {}  # each held signal's disposition when holding began
_held: dict[int, Any] = {}  # signal -> the handler to put back when it is released
received: list[int] = []  # held signals that came, in order, each once


def _note(signum: int, frame: Any) -> None:
    if signum not in received:
        received.append(signum)


def hold() -> None:
    """Hold Ctrl-C and SIGTERM (main thread only; elsewhere nothing is held)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in HELD_SIGNALS:
        try:
            current = _get_handler(signum)
        except (ValueError, OSError):
            continue
        _inherited.setdefault(signum, current)
        if current is signal.SIG_IGN or current is None or signum in _held:
            continue  # ignored stays ignored; None: a handler set from C, not ours to move
        _held[signum] = current
        _set_handler(signum, _note)


def inherited(signum: int) -> Any:
    """The disposition ``signum`` had when holding began (the handler now in place when
    it was never held)."""
    if signum in _inherited:
        return _inherited[signum]
    return _get_handler(signum)


def holding(signum: int) -> bool:
    return signum in _held


def release(signum: int, handler: Any = None) -> None:
    """Put back ``handler`` (by default what was in place when holding began) and raise
    the signal again if it came while held: its handler runs now, in this thread."""
    if signum not in _held or threading.current_thread() is not threading.main_thread():
        return
    previous = _held.pop(signum)
    _set_handler(signum, previous if handler is None else handler)
    if signum in received:
        received.remove(signum)
        signal.raise_signal(signum)


def release_all() -> None:
    """Every held signal back to its handler, each one that came raised again (SIGTERM
    before Ctrl-C, as it is the one that ends a job)."""
    for signum in sorted(_held, key=lambda s: s != signal.SIGTERM):
        release(signum)


def drop() -> None:
    """Stop holding without raising what came: gpudiag finishes the process anyway."""
    for signum in list(_held):
        if threading.current_thread() is threading.main_thread():
            _set_handler(signum, _held.pop(signum))
    received.clear()
