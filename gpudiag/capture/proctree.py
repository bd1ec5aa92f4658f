"""A process's descendants, from /proc (the launcher's shutdown and the hang watchdog's
usage of a rank and its subprocesses)."""

from __future__ import annotations

import os


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` from /proc/<pid>/task/<tid>/children: a few small
    reads, where psutil's children() reads every process's stat file (4-5 ms of CPU
    with ~160 processes). OSError where the kernel has no such file."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:  # gone meanwhile
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except FileNotFoundError:
                if parent == pid and tid == str(pid) and os.path.exists(f"/proc/{pid}"):
                    raise  # no children files in this kernel
                continue
            found += kids
            todo += kids
    return found
