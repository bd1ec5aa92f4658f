"""How a script ends, for tests/test_exit_paths.py: `exit_paths.py MODE`.

exit256 / exithuge: sys.exit(256) / sys.exit(2**70) after training (one process).
atexit_ddp: 2 gloo ranks; an atexit handler all-reduces and prints the result.
badstr: raises an exception whose __str__ raises (one process).
preinit: 2 ranks; rank 1 fails before init_process_group, rank 0 waits in it.
slow_init: 2 ranks; rank 1 sleeps before init_process_group, rank 0 waits in it.
depth: prints how deep the script can recurse.
excepthook: raises with its own sys.excepthook installed.
sigusr1: sends itself SIGUSR1 (not handled: python dies of it) after 3 steps.
sigusr2: the same with SIGUSR2.
ansi: raises with terminal escapes and a right-to-left override in the message.
handles_sigint: one process; its SIGINT handler notes the signal and training goes on.
"""

import atexit
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

mode = sys.argv[1]


def train(steps: int, model: nn.Module | None = None, until=None) -> None:
    """``steps`` steps, or until ``until()`` is true and then ``steps`` more."""
    model = model or nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    while done < steps:
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        if until is None or until():
            done += 1
        else:
            time.sleep(0.02)


class Weird(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


if mode in ("exit256", "exithuge"):
    train(3)
    sys.exit(256 if mode == "exit256" else 2**70)
elif mode == "badstr":
    train(3)
    raise Weird()
elif mode == "atexit_ddp":
    dist.init_process_group("gloo")

    def at_exit() -> None:
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()}: atexit all_reduce={t.item()}", flush=True)

    atexit.register(at_exit)
    train(3, nn.parallel.DistributedDataParallel(nn.Linear(16, 4)))
elif mode == "preinit":
    if int(os.environ["RANK"]) == 1:
        time.sleep(3)  # rank 0 is in the rendezvous by then
        with open("/nonexistent/gpudiag-test/config.yaml"):
            pass
    dist.init_process_group("gloo")
    dist.barrier()
elif mode == "slow_init":
    if int(os.environ["RANK"]) == 1:
        time.sleep(120)  # rank 0 waits for it in the rendezvous
    dist.init_process_group("gloo")
elif mode == "handles_sigint":
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    train(20, until=lambda: bool(seen))
    print(f"finished after the signal {seen}", flush=True)
elif mode == "depth":

    def deepest(n: int) -> int:
        try:
            return deepest(n + 1)
        except RecursionError:
            return n

    print(f"max depth {deepest(0)}", flush=True)
elif mode == "excepthook":

    def hook(kind, value, tb) -> None:
        print(f"CUSTOM HOOK: {kind.__name__}: {value}", file=sys.stderr, flush=True)

    sys.excepthook = hook
    raise ValueError("handled by my excepthook")
elif mode in ("sigusr1", "sigusr2"):
    train(3)
    os.kill(os.getpid(), signal.SIGUSR1 if mode == "sigusr1" else signal.SIGUSR2)
    train(3)
    print("still running", flush=True)
elif mode == "ddp_raise":

    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] == 3:
                raise ValueError("boom in forward")
            return self.layer(x)

    dist.init_process_group("gloo")
    ddp = nn.parallel.DistributedDataParallel(Fails())
    train(3, ddp)
    ddp(torch.randn(3, 16))
elif mode == "ansi":
    train(3)
    raise RuntimeError("\x1b[31mRED\x1b[0m \u202eRTL")
