"""2 mp.spawn gloo DDP ranks; rank 1 dies without a status. Each rank writes
ready.<rank> (its pid) after its first step, then trains until the job ends.

Usage: spawn_rank_dies.py PORT HOW
  kill:   rank 1 waits to be killed from outside (the test SIGKILLs the pid in ready.1)
  osexit: rank 1 calls os._exit(3) after its third step
Traced by tests/test_spawn_signals.py (probe 28i, F6)."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, port: int, how: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while True:
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        step += 1
        if step == 1:
            with open(f"ready.{rank}.tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(f"ready.{rank}.tmp", f"ready.{rank}")
        if rank == 1 and how == "osexit" and step == 3:
            os._exit(3)
        time.sleep(0.05)


if __name__ == "__main__":
    mp.spawn(work, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2)
