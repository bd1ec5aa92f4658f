"""Training steps and torch work on threads other than the main one (issue 28's second
probe): `stepthread` runs each step in a new thread; `earlyend` runs the model in a
thread that ends before the first step."""

import sys
import threading

import torch
import torch.nn as nn

MODE = sys.argv[1]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def step() -> None:
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def evaluate() -> None:
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(32, 64))


if MODE == "stepthread":
    for _ in range(12):
        t = threading.Thread(target=step)
        t.start()
        t.join()
elif MODE == "earlyend":
    t = threading.Thread(target=evaluate)
    t.start()
    t.join()
    for _ in range(12):
        step()
print("done", flush=True)
