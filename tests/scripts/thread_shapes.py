"""Training steps and torch work on threads other than the main one (issue 28's second
probe): `stepthread` runs each step in a new thread; `earlyend` runs the model in a
thread that ends before the first step. Third probe: `stepper` steps the optimizer in a
long-lived thread of its own, fed by a queue, while another thread makes the batches;
`threadloop` runs the whole loop in one thread; `chunks` runs 3 steps per new thread."""

import queue
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
elif MODE == "stepper":
    requests: queue.Queue = queue.Queue()
    stepped: queue.Queue = queue.Queue()

    def stepper() -> None:
        while requests.get() is not None:
            opt.step()
            stepped.put(1)

    def batches() -> None:
        for _ in range(12):
            x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            requests.put(1)
            stepped.get()
        requests.put(None)

    threads = [threading.Thread(target=stepper), threading.Thread(target=batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
elif MODE == "threadloop":
    t = threading.Thread(target=lambda: [step() for _ in range(10)])
    t.start()
    t.join()
elif MODE == "chunks":
    for _ in range(4):
        t = threading.Thread(target=lambda: [step() for _ in range(3)])
        t.start()
        t.join()
print("done", flush=True)
