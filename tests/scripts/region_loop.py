"""Issue 28's script, as the probe wrote it: a one-process loop with `gpudiag.region`
around every step and nothing else. Under `gpudiag trace` it crashed with SIGSEGV in 3 to
5 of 6 runs on a loaded host before the profiler was started only once per process."""

import torch

import gpudiag

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
y = torch.randint(0, 10, (32,))
for _ in range(30):
    with gpudiag.region("step"):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
print("done")
