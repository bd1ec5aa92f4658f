"""The profiler is created by a module of the script's folder, at step 7 (inside gpudiag's
default window 5-9) inside an open record_function: with only the script's own source
read, the job crashed in 3 of 6 traced runs (rc 139, 134, 139; plain python 0 of 7;
probe 28d, defect 9)."""

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profiler_helper  # noqa: E402

torch.manual_seed(0)
m = nn.Linear(32, 32)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
prof = None
total = 0.0
for i in range(14):
    with torch.autograd.profiler.record_function("user_step"):
        if i == 7:
            prof = profiler_helper.start()
        opt.zero_grad()
        loss = m(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
    total += loss.item()
assert prof is not None
prof.__exit__(None, None, None)
print("total", round(total, 5), "events", len(prof.key_averages()) > 0)
