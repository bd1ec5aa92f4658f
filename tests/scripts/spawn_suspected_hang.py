"""Two mp.spawn ranks: rank 0 waits in an all_reduce that rank 1 never joins (rank 1
sleeps in Python), so gpudiag's watchdog suspects a hang. argv: the rendezvous port."""

import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, port: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
