"""A job whose ranks handle SIGUSR1 and SIGUSR2 the way a SLURM requeue handler does:
save (got.<rank>.<signal>) and train on. Each rank writes ready.<rank> once it has
trained a step with its handlers in place, trains until the file ``stop`` exists, then
writes done.<rank> and ends normally. Traced by tests/test_user_signals.py (probe 28i, F3).

Usage: user_signal_job.py MODE PORT
  single:   one process, no process group
  spawn:    torch.multiprocessing.spawn, 2 gloo DDP ranks
  torchrun: a rank torchrun started (RANK, WORLD_SIZE, MASTER_* from the environment)
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WHO = ["0"]


def on_user_signal(signum: int, frame: object) -> None:
    with open(f"got.{WHO[0]}.{signal.Signals(signum).name}", "a") as fh:
        fh.write(f"{os.getpid()}\n")


def _stop(world: int) -> bool:
    """``stop`` exists, agreed by every rank (they end after the same step)."""
    flag = torch.tensor([float(os.path.exists("stop"))])
    if world > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def work(rank: int, world: int, port: int) -> None:
    WHO[0] = str(rank)
    signal.signal(signal.SIGUSR1, on_user_signal)
    signal.signal(signal.SIGUSR2, on_user_signal)
    model: torch.nn.Module = torch.nn.Linear(16, 4)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while step < 2 or not _stop(world):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        if step == 0:
            open(f"ready.{rank}", "w").close()
        step += 1
        time.sleep(0.05)
    if world > 1:
        dist.destroy_process_group()
    open(f"done.{rank}", "w").close()


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "spawn":
        mp.spawn(work, args=(2, port), nprocs=2)
    elif mode == "torchrun":
        work(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), port)
    else:
        work(0, 1, port)
