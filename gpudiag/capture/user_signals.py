"""SIGUSR1 / SIGUSR2 to `gpudiag trace`: passed on to the job's processes that handle them.

Under plain ``python train.py`` a ``kill -USR1`` reaches the script, whose handler runs
and training goes on (SLURM's ``--signal=USR1@N`` and Lightning's auto-requeue save a
checkpoint and requeue). The launcher died of the default action instead, and the job
with it (probe 28i, F3). The launcher now handles both and sends each, once, to every
process of the job that catches it (``SigCgt`` in /proc/<pid>/status): the script's
process, the ranks mp.spawn or torchrun started, not torchrun's agent or a helper that
would die of it. When no process catches it, the job's own process gets it, as under
plain python or torchrun, whose default action then ends it. The launcher never stops
the job for it: no grace period, no kill, the run's outcome is the job's.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

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


def receivers(job_pid: int, pids: Iterable[int], signum: int) -> list[int]:
    """The processes that get ``signum``: those that catch it, else the job's own."""
    catching = [pid for pid in pids if catches(pid, signum)]
    return catching or [job_pid]


def handled_signals() -> list[int]:
    """The user signals the launcher takes over: not one it was started ignoring (its
    job inherits that, as it would under plain python)."""
    return [s for s in USER_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
