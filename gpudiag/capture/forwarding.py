"""The launcher's signals, passed to the job it started (gpudiag/capture/launcher.py)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any, Protocol

from gpudiag.capture import leftovers, user_signals
from gpudiag.capture.launch_outcome import _forwarded_signals, job_signal

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
    signal the launcher handles is reset to the default in the processes it starts. A stop
    the launcher was started ignoring (a shell script's background job, ``nohup``) stays
    ignored in the job's processes, which inherit it; once the job has started it is
    passed to the processes of the job whose script handles it, as under plain python,
    where the script's own handler gets it (probe 28k, A), and otherwise dropped. A
    hang-up goes to the processes whose script handles SIGHUP, as under plain python or
    torchrun (probe 28k, B: it was turned into SIGTERM), and ends the job as SIGTERM does
    when none does. A signal that arrives while the job is being started is forwarded
    once it has started."""

    def __init__(self) -> None:
        self._early: list[int] = []
        self._job: ForwardedJob | None = None
        stops = _forwarded_signals()
        self._ignored = [s for s in STOPS if s not in stops]  # inherited ignored
        self._previous = {s: signal.signal(s, self._forward) for s in stops}
        if signal.SIGHUP in stops:
            signal.signal(signal.SIGHUP, self._hang_up)
        for s in user_signals.handled_signals():
            self._previous[s] = signal.signal(s, self._pass_on)

    def _catchers(self, job: ForwardedJob, signum: int) -> list[int]:
        """The job's processes that handle ``signum``; never torchrun's agent, which is
        gpudiag's, not the user's."""
        pids = job.pids()
        if not job.signal_group:
            pids = [p for p in pids if p != job.proc.pid]
        return user_signals.receivers(pids, signum)

    def _pass_to_catchers(self, job: ForwardedJob, signum: int) -> bool:
        receivers = self._catchers(job, signum)
        if receivers:
            job.passed_signals.append(signum)
            leftovers.send(receivers, signum)
        return bool(receivers)

    def _hang_up(self, signum: int, frame: Any) -> None:
        job = self._job
        if job is None:
            self._early.append(signum)
        elif not self._pass_to_catchers(job, signum):
            self._forward(signum, frame)

    def _pass_ignored(self, signum: int, frame: Any) -> None:
        # not with --nproc-per-node: torchrun's agent sets handlers of its own, whatever it
        # inherited, and its ranks take Ctrl-C as python's default, not as the script's
        if self._job is not None and self._job.signal_group:
            self._pass_to_catchers(self._job, signum)

    def _pass_on(self, signum: int, frame: Any) -> None:
        """SIGUSR1, SIGQUIT & co. (capture/user_signals): to the job's processes that
        handle it, the job going on; when none does, the job is ended by it."""
        job = self._job
        if job is None:  # no process of the job has a handler yet: plain python dies of it
            self._early.append(signum)
            return
        if not self._pass_to_catchers(job, signum):
            self._forward(signum, frame)

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
        for s in self._ignored:  # the job's processes have inherited the ignore
            self._previous[s] = signal.signal(s, self._pass_ignored)
        for signum in self._early:  # arrived while the job was being started
            if signum in user_signals.PASSED_SIGNALS:
                self._pass_on(signum, None)
        stops = [s for s in self._early if s not in user_signals.PASSED_SIGNALS]
        if stops:
            self._forward(stops[0], None)

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
