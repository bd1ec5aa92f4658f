"""2 mp.spawn gloo DDP ranks; the parent and each rank register an atexit handler that
writes atexit.<who>.<pid>. Usage: spawn_atexit.py PORT START_METHOD. Run plain and
traced by tests/test_spawn_signals.py (probe 28i, F1)."""

import atexit
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def mark(who: str) -> None:
    open(f"atexit.{who}.{os.getpid()}", "w").close()


def work(rank: int, port: int) -> None:
    atexit.register(mark, f"rank{rank}")
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    for _ in range(3):
        model(torch.randn(2, 8)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    atexit.register(mark, "parent")
    port, method = int(sys.argv[1]), sys.argv[2]
    mp.start_processes(work, args=(port,), nprocs=2, start_method=method)
