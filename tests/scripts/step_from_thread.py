"""`gpudiag.step()` called from a background thread while the main thread trains (API
misuse a script may make): the profiler was stopped and exported from that thread, in
the middle of the main thread's forward, and the job died of SIGSEGV (issue 28 probe,
2026-12-02). Steps may be cut oddly; the job must finish."""

import threading
import time

import torch

import gpudiag


def marker() -> None:
    for _ in range(200):
        gpudiag.step()
        time.sleep(0.002)


model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
thread = threading.Thread(target=marker)
thread.start()
for _ in range(300):
    opt.zero_grad()
    model(torch.randn(64, 256)).sum().backward()
    opt.step()
thread.join()
print("done")
