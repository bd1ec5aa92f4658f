"""Started by `gpudiag trace` with SIGNAL ignored (argv[1]: its name): notes whether it
inherited the ignore (argv[2]), sends SIGNAL to its launcher, then SIGUSR1, which the
launcher passes back to this process (it catches it). Python runs the launcher's
handlers in signal-number order, so when SIGUSR1 is back, SIGNAL was handled (or
ignored) there first: no timing margin. Then it ends normally."""

import os
import signal
import sys
import threading

back = threading.Event()
signal.signal(signal.SIGUSR1, lambda signum, frame: back.set())
signum = getattr(signal, sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write("ignored" if signal.getsignal(signum) is signal.SIG_IGN else "handled")
launcher = os.getppid()
os.kill(launcher, signum)
os.kill(launcher, signal.SIGUSR1)
while not back.wait(0.05):
    pass
print("trained on")
