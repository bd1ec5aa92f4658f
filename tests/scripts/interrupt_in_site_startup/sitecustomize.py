"""Ctrl-C during the traced process's site start-up, before any of gpudiag runs (as
from a .pth file's import): in the process gpudiag started, this sends SIGINT to its
parent (the launcher, which forwards it to the job) and waits for it to raise here. A
KeyboardInterrupt out of site start-up is python's "Fatal Python error:
init_import_site", exit 1, no status.json (no timing margin: it waits for the signal)."""

import os
import signal
import sys
import time

if "gpudiag.capture.rank" in " ".join(getattr(sys, "orig_argv", ())):
    os.kill(os.getppid(), signal.SIGINT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the forwarded SIGINT raises here
        time.sleep(0.01)
