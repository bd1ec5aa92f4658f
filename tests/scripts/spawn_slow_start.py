"""mp.spawn of 2 workers that are slow to start: each, re-importing this script
(``__mp_main__``), writes importing.<pid> and sleeps, before any rank code runs, so a
signal can reach it before it has a handler. Traced by tests/test_spawn_signals.py
(probe 28i, F5)."""

import os
import sys
import time

import torch.multiprocessing as mp

if __name__ == "__mp_main__":
    open(f"importing.{os.getpid()}", "w").close()
    time.sleep(120)


def work(rank: int) -> None:
    time.sleep(120)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "before":
        open("importing.main", "w").close()
        time.sleep(120)
    mp.spawn(work, nprocs=2)
