"""Ctrl-C while the traced process imports torch, at a chosen point of the import
(no timing margin): when the process gpudiag started first imports the module named
by GPUDIAG_TEST_INTERRUPT_AT, this sends SIGINT to its parent (the launcher, which
forwards it to the job) and waits for it to arrive here: either as a KeyboardInterrupt
inside the import (noted in GPUDIAG_TEST_RAISED_LOG: where C++ calls back into Python,
that aborts the process), or held by gpudiag until the script starts
(gpudiag.capture.deferred_signals notes it). Every later import of torch is noted in
GPUDIAG_TEST_REIMPORT_LOG."""

import os
import signal
import sys
import time

_AT = os.environ.get("GPUDIAG_TEST_INTERRUPT_AT")
_LOG = os.environ.get("GPUDIAG_TEST_REIMPORT_LOG")
_RAISED = os.environ.get("GPUDIAG_TEST_RAISED_LOG")


def _held() -> bool:
    deferred = sys.modules.get("gpudiag.capture.deferred_signals")
    return deferred is not None and signal.SIGINT in getattr(deferred, "received", ())


class _InterruptAt:
    fired = False

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if _InterruptAt.fired:
            if name == "torch" and _LOG:
                with open(_LOG, "a") as f:
                    f.write(f"{name} imported again\n")
            return None
        if name == _AT:
            _InterruptAt.fired = True
            os.kill(os.getppid(), signal.SIGINT)
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline and not _held():
                    time.sleep(0.01)
            except KeyboardInterrupt:
                if _RAISED:
                    with open(_RAISED, "a") as f:
                        f.write(f"KeyboardInterrupt raised inside the import of {name}\n")
                raise
            if not _held():
                raise KeyboardInterrupt  # never forwarded: the test fails on its own asserts
        return None


if _AT and "gpudiag.capture.rank" in " ".join(getattr(sys, "orig_argv", ())):
    sys.meta_path.insert(0, _InterruptAt())
