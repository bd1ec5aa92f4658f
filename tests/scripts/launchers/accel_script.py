"""A training script written for `accelerate launch` (Accelerator, no launcher code).
Traced by tests/test_launchers.py as `gpudiag trace --nproc-per-node 2 accel_script.py`:
Accelerator reads torchrun's environment."""

import sys

import torch
import torch.nn as nn
from accelerate import Accelerator


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(steps):
        optimizer.zero_grad()
        accelerator.backward(model(torch.randn(16, 32)).square().mean())
        optimizer.step()
    accelerator.print(f"world {accelerator.num_processes}")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
