"""Single-process training script for gpudiag's capture tests.

Prints its argv as one JSON line (so a test can check that arguments arrive untouched),
trains a tiny MLP for --steps steps and exits with --exit-code.
"""

import argparse
import json
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--label", default="")
p.add_argument("--log", default="")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--linger", type=float, default=0.0)  # a non-daemon thread outlives the loop
p.add_argument("--out", default="")  # same name as a gpudiag option: must reach the script
args = p.parse_args()

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(args.steps * 4, 16), torch.randn(args.steps * 4, 1))
for x, y in DataLoader(data, batch_size=4):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    time.sleep(args.sleep)
print(f"DONE {args.steps}", flush=True)
if args.log:
    # left open and unflushed on purpose, and written late by a non-daemon thread: a
    # plain interpreter exit waits for the thread and flushes the file; so must gpudiag
    log = open(args.log, "w")  # noqa: SIM115
    log.write("first line\n")
    threading.Thread(target=lambda: (time.sleep(0.5), log.write("from thread\n"))).start()
if args.linger:
    threading.Thread(target=time.sleep, args=(args.linger,), name="linger").start()
sys.exit(args.exit_code)
