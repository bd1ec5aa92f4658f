"""A rank blocked in C code still ends on the job's SIGTERM or Ctrl-C (runs in each rank).

Python runs a signal's handler only when the main thread executes bytecode. A rank
blocked in C++ (init_process_group's rendezvous waiting for a peer that died, a
collective without a timeout) does not act on the SIGTERM that torchrun sends it when a
peer fails, nor on a forwarded Ctrl-C: torchrun SIGKILLs it 30 s later and its status is
lost (issue 28, fifth probe: F4, F5). Under plain torchrun SIGTERM's default action ends
such a rank at once; gpudiag's own SIGTERM handler (it turns SIGTERM into an interrupt
the script can clean up after) took that away.

The watcher: ``signal.set_wakeup_fd`` makes Python's C-level handler write each signal's
number to a pipe, which gpudiag's service thread (:class:`gpudiag.capture.threads.Service`)
reads while the main thread is blocked. For a
SIGTERM or SIGINT whose handler is gpudiag's or Python's default (never one the script
installed: that is the script's decision, and it waits for the C call under plain python
too), the service watches the main thread's current frame for ``ACT_S`` (3 s after a
SIGTERM, 10 s after a Ctrl-C). A frame that
moves is executing bytecode, so the handler ran (it raised into the script, or the
script caught it: the script's business). A frame that stays put is stuck in C: the rank
is then finished from the service thread as an interrupt, the way hang ends are, and exits.

A script that sets its own wakeup fd (asyncio's event loop does) replaces the watcher's:
nothing is watched then, as before.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from gpudiag.capture import threads

# how long the main thread may stay in one place after the signal before it is deemed
# blocked in C (torchrun's grace before SIGKILL is 30 s): SIGTERM's default action ends
# a process at once; a Ctrl-C waits longer, for a C call that may yet return
ACT_S: dict[int, float] = {signal.SIGTERM: 3.0, signal.SIGINT: 10.0}
POLL_S = 0.1
CHECK_TASK = "signal watch"


def _main_position() -> tuple[int, int] | None:
    """(id of the main thread's innermost frame, its last instruction), or None."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return None
    return id(frame), frame.f_lasti


def _forget_wakeup_fd(ours: int) -> None:
    """In a forked child: the watcher's wakeup fd is dropped; one the script set since
    (an event loop's) is the script's and stays."""
    try:
        previous = signal.set_wakeup_fd(-1)
        if previous not in (-1, ours):
            signal.set_wakeup_fd(previous)
    except (ValueError, OSError):  # not the main thread of the child
        pass


class SignalWatch:
    """Reads the wakeup pipe; calls ``on_stuck(signum)`` for a watched signal the main
    thread did not act on. ``handlers_of_ours(signum)`` says whether the handler now in
    place is gpudiag's or Python's default (the script installed none)."""

    def __init__(
        self,
        on_stuck: Callable[[int], None],
        handlers_of_ours: Callable[[int], bool],
        act_s: dict[int, float] | None = None,
    ) -> None:
        self.on_stuck = on_stuck
        self.handlers_of_ours = handlers_of_ours
        self.act_s = act_s or ACT_S
        self.poll_s = POLL_S
        # (signal, the main thread's position when it arrived, when it is deemed stuck)
        self._watches: list[tuple[int, tuple[int, int], float]] = []

    def start(self) -> bool:
        """From the main thread only (set_wakeup_fd's rule); False when it cannot watch."""
        if threading.current_thread() is not threading.main_thread():
            return False
        service = threads.service()
        write_fd = service.signal_fd(self._on_signals)
        if write_fd < 0:
            return False
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (OSError, ValueError):
            return False
        if previous not in (-1, write_fd):  # somebody else's (an event loop's): theirs
            signal.set_wakeup_fd(previous)
            return False
        # a forked child (a DataLoader worker) keeps the wakeup fd: its own signals (the
        # loader's SIGTERM at shutdown) would read here as this rank's
        os.register_at_fork(after_in_child=functools.partial(_forget_wakeup_fd, write_fd))
        return True

    def _on_signals(self, signums: list[int]) -> None:
        """In gpudiag's service thread, as the signals arrive: a watched signal whose
        handler is ours starts a watch of the main thread's position."""
        now = time.monotonic()
        for signum in sorted(set(signums)):
            try:
                if not self.handlers_of_ours(signum):
                    continue
                start = _main_position()
            except Exception:  # noqa: BLE001 - the watcher must never take the rank down
                continue
            if start is not None:
                self._watches.append((signum, start, now + self.act_s.get(signum, 3.0)))
        if self._watches and not threads.service().has(CHECK_TASK):
            threads.service().add(CHECK_TASK, self._check, self.poll_s, first_in=self.poll_s)

    def _check(self) -> object:
        """Every ``poll_s`` while a signal is watched: a main thread that moved acted on
        it; one still in place after the signal's ``act_s`` is stuck in C."""
        position = _main_position()
        now = time.monotonic()
        watches, self._watches = self._watches, []
        for signum, start, deadline in watches:
            if position != start:
                continue
            if now < deadline:
                self._watches.append((signum, start, deadline))
                continue
            try:
                self.on_stuck(signum)
            except Exception:  # noqa: BLE001 - the watcher must never take the rank down
                pass
        return None if self._watches else threads.STOP
