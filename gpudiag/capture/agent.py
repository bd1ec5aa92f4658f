"""``python -m gpudiag.capture.agent [torchrun options] -m gpudiag.capture.worker ...``:
torch.distributed.run as ``gpudiag trace`` starts it.

The same elastic agent as ``torchrun``, with three differences:

- it ends when the launcher dies (parent-death signal, :func:`die_with_parent`), and the
  agent then ends its workers, so a SIGKILLed ``gpudiag trace`` leaves no orphans;
- a Ctrl-C or SIGTERM that the launcher forwards ends it with 128 + the signal and no
  Python traceback (torchrun prints its ``SignalException``; gpudiag reports the
  interrupt itself);
- it ends with ``os._exit`` once the agent has returned: the interpreter teardown of a
  process that imported torch's elastic stack took 2-3 s on the 2-core machines, which
  made every Ctrl-C take 3-4 s.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
ENV_LAUNCHER_PID = "GPUDIAG_LAUNCHER_PID"
LIVENESS_POLL_S = 0.5


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies. True when set
    (False elsewhere than Linux, or when prctl is unavailable)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_launcher(
    on_lost: object, pid: int | None = None, poll_s: float = LIVENESS_POLL_S
) -> bool:
    """Fallback for the parent-death signal (lost when the parent died before it was
    set, or the process was reparented): a daemon thread that calls ``on_lost()`` once
    the launcher's pid (``GPUDIAG_LAUNCHER_PID``) is gone or this process was reparented
    away from it. False when there is no launcher pid to watch."""
    if pid is None:
        try:
            pid = int(os.environ.get(ENV_LAUNCHER_PID, ""))
        except ValueError:
            return False
    if pid <= 0:
        return False
    watched = pid

    def run() -> None:
        while True:
            if not pid_alive(watched):
                on_lost()  # type: ignore[operator]
                return
            time.sleep(poll_s)

    threading.Thread(target=run, name="gpudiag-launcher-watch", daemon=True).start()
    return True


def _on_launcher_lost() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_parent(signal.SIGTERM)
    watch_launcher(_on_launcher_lost)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    code = 0
    try:
        torchrun_main(argv)
    except SignalException as exc:
        code = 128 + int(getattr(exc, "sigval", signal.SIGTERM))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
