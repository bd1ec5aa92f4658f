"""A job for signals sent to `gpudiag trace` itself (tests/test_launcher_signals.py,
tests/test_user_signals.py): each rank installs a handler for the signals named on the
command line (it writes got.<rank>.<SIGNAL> and trains on), writes ready.<rank> once it
has trained a step with them in place, trains until the file ``stop`` exists, then
writes done.<rank>. With EXIT_IN_HANDLER=N in the environment the handler then calls
sys.exit(N).

Usage: launcher_signal_job.py MODE PORT [SIGNAL ...]
  single:   one process, no process group
  spawn:    torch.multiprocessing.spawn, 2 gloo DDP ranks
  torchrun: a rank torchrun started (RANK, WORLD_SIZE from the environment)
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WHO = ["0"]


def on_signal(signum: int, frame: object) -> None:
    with open(f"got.{WHO[0]}.{signal.Signals(signum).name}", "a") as fh:
        fh.write(f"{os.getpid()}\n")
    if os.environ.get("EXIT_IN_HANDLER"):  # save, then end: the script's own exit code
        sys.exit(int(os.environ["EXIT_IN_HANDLER"]))


def _stop(world: int) -> bool:
    """``stop`` exists, agreed by every rank (they end after the same step)."""
    flag = torch.tensor([float(os.path.exists("stop"))])
    if world > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def work(rank: int, world: int, port: int, handled: list[str]) -> None:
    WHO[0] = str(rank)
    for name in handled:
        signal.signal(getattr(signal, name), on_signal)
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
            with open(f"ready.{rank}", "w") as fh:
                fh.write(f"{os.getpid()}\n")
        step += 1
        time.sleep(0.05)
    if world > 1:
        dist.destroy_process_group()
    open(f"done.{rank}", "w").close()


if __name__ == "__main__":
    mode, port, handled = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if mode == "spawn":
        mp.spawn(work, args=(2, port, handled), nprocs=2)
    elif mode == "torchrun":
        work(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), port, handled)
    else:
        work(0, 1, port, handled)
