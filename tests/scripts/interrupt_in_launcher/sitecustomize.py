"""Ctrl-C to `gpudiag trace` itself at a named point of its start-up: when the launcher
process (``gpudiag trace`` run as ``python -m gpudiag``) first calls the function named
by GPUDIAG_TEST_LAUNCHER_SIGINT_AT (``module:function``), it sends itself SIGINT, which
acts at that function's next bytecode (no timing margin). The variable is taken out of
the environment, so the job's processes do nothing."""

import os
import signal
import sys

_AT = os.environ.pop("GPUDIAG_TEST_LAUNCHER_SIGINT_AT", "")

if _AT:
    _module, _function = _AT.split(":")

    def _interrupt_at(frame, event, arg):  # type: ignore[no-untyped-def]
        if (
            event == "call"
            and frame.f_code.co_name == _function
            and frame.f_globals.get("__name__") == _module
        ):
            sys.setprofile(None)
            sys.stderr.write(f"test: SIGINT at {_AT}\n")
            os.kill(os.getpid(), signal.SIGINT)

    sys.setprofile(_interrupt_at)
