"""A small gloo DDP job (no gpudiag code) that misbehaves on request, for the reliability
tests (tests/test_reliability_gloo.py). Run under `gpudiag trace --nproc-per-node N`.

Usage: rel_job.py MODE [STEPS] [AT]. Modes:
  ok               plain training
  eval             every rank runs an 8 s Python-only phase (no step, no collective) at AT
  checkpoint       rank 0 runs an 8 s Python-only phase at AT while the others wait in a barrier
  rendezvous       rank 1 sleeps before init_process_group (the others wait in the rendezvous)
  first            rank 1 sleeps after init, before DDP (the others wait in DDP's broadcast)
  sigkill          rank 1 SIGKILLs itself at step AT (as the OOM killer would)
  segfault         rank 1 reads address 0 at step AT
  skip             the last rank skips one all_reduce at step AT
  size             the last rank all-reduces a different size at step AT
  big ODD          rank ODD all-reduces 1000 floats where the others reduce 1, at step AT
  skipone ODD      rank ODD skips one all_reduce at step AT
  sigterm-me       rank 1 sleeps 0.2 s a step after AT (a test sends it SIGTERM from outside)
  sigstop          rank 1 stops itself (SIGSTOP) in the backward of step AT, after writing
                   its pid to $REL_JOB_PIDFILE: frozen, not dead (a debugger, a `kill -STOP`)
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def busy(seconds: float) -> float:
    """Python work for `seconds` of wall time (an evaluation, a checkpoint)."""
    t0, acc = time.monotonic(), 0.0
    while time.monotonic() - t0 < seconds:
        acc += sum(i * 0.5 for i in range(2000))
    return acc


def main() -> None:
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    at = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    odd = int(sys.argv[4]) if len(sys.argv) > 4 else None
    rank = int(os.environ["RANK"])
    last = int(os.environ["WORLD_SIZE"]) - 1
    if mode == "rendezvous" and rank == 1:
        time.sleep(300)  # rank 1 never joins the rendezvous
    dist.init_process_group("gloo")
    if mode == "first" and rank == 1:
        time.sleep(300)  # rank 1 never joins DDP's start-up broadcast
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "sigstop" and rank == 1:
        with open(os.environ["REL_JOB_PIDFILE"], "w") as fh:
            fh.write(str(os.getpid()))
    for step in range(steps):
        loss = model(torch.randn(16, 64)).sum()
        if mode == "sigstop" and rank == 1 and step == at:
            # in the middle of the backward, as a SIGSTOP lands in a real job: its peer
            # then waits inside backward, DDP's reducer busy with the bucket
            loss.register_hook(lambda grad: os.kill(os.getpid(), 19) or grad)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if mode in ("big", "skipone"):
            dist.all_reduce(torch.ones(1))  # the same small call every step, every rank
        if mode == "sigterm-me" and step >= at:
            time.sleep(0.2)
        if step != at:
            continue
        if mode == "eval":
            busy(8.0)
        elif mode == "checkpoint":
            if rank == 0:
                busy(8.0)
            dist.barrier()
        elif mode == "sigkill" and rank == 1:
            os.kill(os.getpid(), 9)
        elif mode == "segfault" and rank == 1:
            ctypes.string_at(0)
        elif mode == "skip":
            if rank != last:
                dist.all_reduce(torch.ones(1024))  # the last rank never calls this one
        elif mode == "size":
            dist.all_reduce(torch.ones(1024 if rank != last else 512))
        elif mode == "big":
            dist.all_reduce(torch.ones(1000 if rank == odd else 1))
        elif mode == "skipone" and rank != odd:
            dist.all_reduce(torch.ones(1))  # rank ODD never calls this one
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
