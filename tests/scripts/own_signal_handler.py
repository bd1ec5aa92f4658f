"""Trains until signalled; its own SIGINT handler saves and exits with code 7 (as
checkpoint-on-interrupt scripts do). One process, or DDP on gloo under torchrun. The
ranks chdir into a folder of their own and delete it (the script's path was relative),
then keep calling collectives."""

import os
import shutil
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def save_and_exit(signum, frame):
    print(f"SAVED on signal {signum}", flush=True)
    sys.exit(7)


signal.signal(signal.SIGINT, save_and_exit)
distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("gloo")
model = torch.nn.Linear(16, 4)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gone = tempfile.mkdtemp(prefix="gone_")
os.chdir(gone)
shutil.rmtree(gone)
for _ in range(100000):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    if distributed:
        dist.barrier()
    time.sleep(0.02)
