"""A script that leaves a forked child running when it ends (tests/test_leftovers.py).

``stuck``: the child ignores SIGTERM, as a DataLoader worker deadlocked in os.fork does;
``daemon``: the child starts a session of its own first; ``late``: the child ends by
itself after 1 s, writing ``child<rank>.ended``. RANK selects the rank that forks
(default 0). The child writes its pid to ``$LEFTOVER_DIR/child<rank>.pid`` and sleeps at
most 300 s, so a failed test leaves nothing for long."""

import os
import signal
import sys
import time


def _child(mode: str, pid_file: str) -> None:
    if mode == "daemon":
        os.setsid()
        # a daemon lets go of its parent's output (a test captures it through pipes)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pid_file + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    if mode == "late":
        time.sleep(1.0)
        with open(pid_file.replace(".pid", ".ended"), "w") as fh:
            fh.write("ended")
        os._exit(0)
    time.sleep(300)
    os._exit(0)


def main() -> None:
    mode = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    forking = int(os.environ.get("LEFTOVER_RANK", "0"))
    if rank != forking:
        return
    pid_file = os.path.join(os.environ["LEFTOVER_DIR"], f"child{rank}.pid")
    if os.fork() == 0:
        _child(mode, pid_file)
    deadline = time.monotonic() + 60
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("parent done", flush=True)


if __name__ == "__main__":
    main()
