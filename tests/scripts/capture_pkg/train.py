"""Run as ``-m capture_pkg.train``: a training loop without an optimizer, stepped with
``gpudiag.step()`` and timed with ``gpudiag.region()``, that exits with --exit-code."""

import json
import sys

import torch

import gpudiag

print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
print("MAIN " + __name__, flush=True)
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 5
code = int(sys.argv[sys.argv.index("--exit-code") + 1]) if "--exit-code" in sys.argv else 0
weight = torch.randn(8, 8, requires_grad=True)
for _ in range(steps):
    with gpudiag.region("compute"):
        loss = (torch.randn(4, 8) @ weight).pow(2).mean()
        loss.backward()
    with torch.no_grad():
        weight -= 0.01 * weight.grad
        weight.grad = None
    gpudiag.step()
sys.exit(code)
