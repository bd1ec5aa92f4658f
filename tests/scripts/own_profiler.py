"""A script that profiles itself with torch.profiler (a schedule, a record_function per
step): under `gpudiag trace` it crashed with SIGSEGV in 4 of 4 runs while both profiled
(issue 28 probe). gpudiag now leaves the profiler to the script."""

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.Adam(model.parameters())
x = torch.randn(32, 64)
y = torch.randint(0, 10, (32,))
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=3),
    record_shapes=True,
) as p:
    for _ in range(15):
        with record_function("mystep"):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        p.step()
print("done")
