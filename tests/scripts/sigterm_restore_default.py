"""Saves the SIGTERM handler it finds, installs its own for the training, puts the saved
one back in its teardown (as Lightning's signal connector does), then gets SIGTERM (as a
re-executed rank does from its parent-death signal). Under python the default action
ends it: exit 143. Traced by tests/test_script_habits.py."""

import os
import signal
import time

import torch

saved = signal.getsignal(signal.SIGTERM)
print("DEFAULT_BEFORE", saved is signal.SIG_DFL, flush=True)
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a notifier that only notes it

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()

signal.signal(signal.SIGTERM, saved)  # the teardown
print("RESTORED", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("NOT_REACHED", flush=True)
