"""The launcher's signals, passed to the job it started (gpudiag/capture/launcher.py)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any, Protocol

from gpudiag.capture import leftovers, user_signals
from gpudiag.capture.launch_outcome import _forwarded_signals, job_signal


class ForwardedJob(Protocol):
    """What the forwarder needs of the launcher's Job."""

    proc: subprocess.Popen
    signal_received: int | None
    signal_group: bool
    passed_signals: list[int]
    on_signal: Callable[[int], None] | None

    def pids(self) -> list[int]: ...

    def stop(self, signum: int = ..., grace_s: float = ...) -> None: ...


class Forwarder:
    """The launcher's signals, forwarded to the job. Handled before the job starts: a
    signal the launcher handles is reset to the default in the processes it starts. One
    the launcher was started ignoring (a shell script's background job, ``nohup``) is
    neither handled nor forwarded: it stays ignored in the job, which trains on as under
    plain python. A signal that arrives while the job is being started is forwarded once
    it has started."""

    def __init__(self) -> None:
        self._early: list[int] = []
        self._job: ForwardedJob | None = None
        self._previous = {s: signal.signal(s, self._forward) for s in _forwarded_signals()}
        for s in user_signals.handled_signals():
            self._previous[s] = signal.signal(s, self._pass_on)

    def _pass_on(self, signum: int, frame: Any) -> None:
        """SIGUSR1, SIGQUIT & co. (capture/user_signals): to the job's processes that
        handle it, the job going on; when none does, the job is ended by it."""
        job = self._job
        if job is None:  # no process of the job has a handler yet: plain python dies of it
            self._early.append(signum)
            return
        pids = job.pids()
        if not job.signal_group:  # torchrun's agent is gpudiag's, never the user's handler
            pids = [p for p in pids if p != job.proc.pid]
        receivers = user_signals.receivers(pids, signum)
        if not receivers:
            self._forward(signum, frame)
            return
        job.passed_signals.append(signum)
        leftovers.send(receivers, signum)

    def _forward(self, signum: int, frame: Any) -> None:
        job = self._job
        if job is None:
            self._early.append(signum)
            return
        if job.signal_received is None:
            job.signal_received = signum
            if job.on_signal is not None:
                job.on_signal(signum)
        job.stop(job_signal(signum))

    def started(self, job: ForwardedJob) -> None:
        self._job = job
        for signum in self._early:  # arrived while the job was being started
            if signum in user_signals.PASSED_SIGNALS:
                self._pass_on(signum, None)
        stops = [s for s in self._early if s not in user_signals.PASSED_SIGNALS]
        if stops:
            self._forward(stops[0], None)

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
