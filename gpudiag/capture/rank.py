"""One rank's process: ``python -m gpudiag.capture.rank <script | -m module> [args...]``.

The launcher (and torchrun's agent) start this module; its work is worker.main. It is a
module of its own so that gpudiag.capture.worker is always imported under its own name,
never as ``__main__``: spawned ranks (spawn.py) get worker's functions by pickling, and the
user's script runs as ``__main__``.

Ctrl-C and SIGTERM are held from here to the user's code (gpudiag.capture.deferred_signals):
a KeyboardInterrupt inside gpudiag's set-up (torch's import) could abort the process.
"""

from __future__ import annotations

from gpudiag.capture import deferred_signals

deferred_signals.hold()

from gpudiag.capture.worker import main  # noqa: E402 - after the signals are held

if __name__ == "__main__":
    main()
