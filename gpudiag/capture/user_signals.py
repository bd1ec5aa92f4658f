"""Signals to `gpudiag trace` other than the stops: passed on to the job's processes that
handle them; when none does, the job is ended as the stop signals end it.

Under plain ``python train.py`` a ``kill -USR1`` reaches the script, whose handler runs
and training goes on (SLURM's ``--signal=USR1@N`` and Lightning's auto-requeue save a
checkpoint and requeue). The launcher died of the default action instead, and the job
with it (probe 28i, F3); so it did of every other signal whose default action ends a
process (SIGQUIT, SIGALRM, SIGVTALRM, SIGPROF, SIGPWR, SIGXCPU, SIGTRAP, ...), its
manifest left ``running`` and mp.spawn's ranks orphaned (probe 28j, F3).

The launcher handles each of :data:`PASSED_SIGNALS` and sends it, once, to every process
of the job that catches it (``SigCgt`` in /proc/<pid>/status): the script's process, the
ranks mp.spawn or torchrun started; never torchrun's agent (gpudiag's, not the user's:
torch's elastic agent catches SIGQUIT only to end its workers). When no process of the
job catches it, the job ends as it does under plain python (the default action kills the
script; an mp.spawn parent's death ends its workers) or torchrun (its agent ends the
workers on SIGQUIT): the launcher ends it as it ends the job on SIGHUP, its ranks
writing their status, the run ``interrupted`` with exit code 128 + the signal and the
signal named in the manifest (``launcher_signal``).

Not taken over: the stops (SIGINT, SIGTERM, SIGHUP: :mod:`gpudiag.capture.forwarding`);
the faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), which are the launcher's own crash
and which a Python handler would turn into a loop at the faulting instruction; SIGPIPE
and SIGXFSZ, which python ignores (in the launcher as in a plain script); and any signal
the launcher was started ignoring (its job inherits that, as under plain python).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

_NAMES = (
    "SIGUSR1",
    "SIGUSR2",
    "SIGQUIT",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGPWR",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGTRAP",
    "SIGSYS",
    "SIGSTKFLT",
    "SIGIO",
)
_REALTIME: tuple[int, ...] = (
    tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1)) if hasattr(signal, "SIGRTMIN") else ()
)
# every signal whose default action ends a process, except the stops and the faults
PASSED_SIGNALS: tuple[int, ...] = (
    *(int(getattr(signal, n)) for n in _NAMES if hasattr(signal, n)),
    *_REALTIME,
)
USER_SIGNALS: tuple[int, ...] = (signal.SIGUSR1, signal.SIGUSR2)


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (not the default, not ignored)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def receivers(pids: Iterable[int], signum: int) -> list[int]:
    """The processes among ``pids`` that catch ``signum``; none: the job is to end."""
    return [pid for pid in pids if catches(pid, signum)]


def handled_signals() -> list[int]:
    """The signals the launcher takes over: not one it was started ignoring (its job
    inherits that, as it would under plain python)."""
    taken = []
    for s in PASSED_SIGNALS:
        try:
            if signal.getsignal(s) is not signal.SIG_IGN:
                taken.append(s)
        except (ValueError, OSError):
            pass
    return taken
