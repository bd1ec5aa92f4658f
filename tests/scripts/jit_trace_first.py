"""The script traces its model with torch.jit.trace before training (issue 28 probe 28e E)."""

import torch

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
traced = torch.jit.trace(model, torch.randn(8, 16))  # check_trace=True: compares two runs
opt = torch.optim.SGD(traced.parameters(), lr=0.01)
for _ in range(6):
    opt.zero_grad()
    traced(torch.randn(8, 16)).sum().backward()
    opt.step()
print("JIT_TRACE_DONE")
