"""2-rank gloo DDP whose ranks have the script's own handlers of SIGTERM, SIGINT, SIGUSR1
and SIGUSR2, installed before ``init_process_group``; a handler saves ckpt.<who>.<signal>
and exits 42. Each rank writes ready.<rank> (JSON: for each signal, whether
``signal.getsignal`` gives the script's handler) once it has trained a step, then trains
until a signal ends it. Traced by tests/test_spawn_signals.py (issue 28, NEW-1).

Usage: spawn_own_handlers.py PORT MODE
  spawn:   torch.multiprocessing.spawn; each worker installs its handlers first
  fork:    torch.multiprocessing.start_processes(start_method="fork"); the parent
           installs them before it starts the ranks, which inherit them
  process: multiprocessing.Process in a fork context (ranks gpudiag does not trace);
           each child installs its handlers first
"""

import json
import multiprocessing
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
WHO = ["main"]


def on_signal(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    with open(f"ckpt.{WHO[0]}.{name}", "w") as fh:
        fh.write("saved")
    print(f"{WHO[0]} saved on {name}", flush=True)
    sys.exit(42)


def install() -> None:
    for name in SIGNALS:
        signal.signal(getattr(signal, name), on_signal)


def own_handlers() -> dict[str, bool]:
    return {name: signal.getsignal(getattr(signal, name)) is on_signal for name in SIGNALS}


def work(rank: int, world: int, port: int, mode: str) -> None:
    WHO[0] = str(rank)
    if mode != "fork":
        install()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ready = False
    try:
        while True:
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            if not ready:
                ready = True
                with open(f"ready.{rank}.tmp", "w") as fh:
                    json.dump(own_handlers(), fh)
                os.replace(f"ready.{rank}.tmp", f"ready.{rank}")
            time.sleep(0.05)
    except KeyboardInterrupt:  # what gpudiag's own SIGTERM handler raises
        with open(f"ckpt.{rank}.KeyboardInterrupt", "w") as fh:
            fh.write("interrupted")
        print(f"{rank} KeyboardInterrupt", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    port, mode = int(sys.argv[1]), sys.argv[2]
    if mode == "spawn":
        mp.spawn(work, args=(2, port, mode), nprocs=2)
    elif mode == "fork":
        install()
        with open("ready.main", "w") as fh:
            json.dump(own_handlers(), fh)
        mp.start_processes(work, args=(2, port, mode), nprocs=2, start_method="fork")
    else:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=work, args=(r, 2, port, mode)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        sys.exit(max(p.exitcode or 0 for p in procs))
