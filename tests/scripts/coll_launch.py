"""Starts tests/scripts/coll_harness.py as a small gloo job (one process per rank)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).with_name("coll_harness.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    mode: str,
    run: Path,
    world_size: int = 2,
    steps: int = 10,
    extra_env: dict[str, str] | None = None,
) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",  # as torchrun: 2 ranks x N OpenMP threads thrash 2 cores
            **(extra_env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HARNESS), mode, str(run), str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> tuple[list[int], str]:
    codes, output = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        codes.append(p.returncode)
        output.append(out or "")
    return codes, "\n".join(output)
