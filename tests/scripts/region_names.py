"""`gpudiag.region` with names a script may pass by mistake (None, a number, a name
with a lone surrogate from a file name): untraced it ignores them, so traced it must
not raise into the step either (issue 28 probe, 2026-12-02)."""

import torch

import gpudiag

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
names = [None, 123, "f\udcff", "x" * 10_000, "ok"]
for i in range(20):
    with gpudiag.region(names[i % len(names)]):  # type: ignore[arg-type]
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
print("done")
