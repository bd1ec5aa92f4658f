"""Graceful preemption (issue 28 probe 28f): the script's SIGTERM handler chains to the
handler it replaced, and a library installs its own only over the default."""

import os
import signal
import sys

import torch

stop = []


def on_term(signum, frame):
    stop.append(signum)
    if callable(previous):  # a good citizen: chain to whoever had SIGTERM before
        previous(signum, frame)


previous = signal.signal(signal.SIGTERM, on_term)
print("DEFAULT_BEFORE", previous is signal.SIG_DFL, flush=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    loss = model(torch.randn(8, 4)).abs().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    if stop:
        torch.save(model.state_dict(), "ckpt.pt")
        print("GRACEFUL_STOP", step, flush=True)
        sys.exit(0)
print("NEVER_STOPPED")
