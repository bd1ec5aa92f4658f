"""The script starts its own torch.profiler at step 7 (inside gpudiag's default window
5-9) inside an open record_function: under `gpudiag trace` it aborted with
`free(): invalid next size` in 2 of 2 runs of the second independent probe (issue 28)."""

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.Adam(m.parameters())
x = torch.randn(32, 64)
y = torch.randint(0, 10, (32,))
p = None
for i in range(16):
    with torch.autograd.profiler.record_function("mystep"):
        if i == 7:
            p = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            p.__enter__()
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if i == 11:
            p.__exit__(None, None, None)
print("own profiler events:", len(p.key_averages()))
