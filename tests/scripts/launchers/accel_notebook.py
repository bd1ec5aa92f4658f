"""accelerate's notebook_launcher starting 2 CPU processes from a script (what a
notebook cell does). Traced by tests/test_launchers.py as
`gpudiag trace accel_notebook.py [STEPS] [PORT]`."""

import sys

import torch
import torch.nn as nn
from accelerate import Accelerator, notebook_launcher


def train(steps: int) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 32)).square().mean()
        accelerator.backward(loss)
        optimizer.step()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    port = sys.argv[2] if len(sys.argv) > 2 else "29581"
    notebook_launcher(train, args=(steps,), num_processes=2, use_port=port)
