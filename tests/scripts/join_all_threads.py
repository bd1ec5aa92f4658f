"""The script joins every thread it finds before it exits, as some shutdown code does
(issue 28 probe 28e I): gpudiag's own threads must not make it wait forever."""

import threading

import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
for thread in threading.enumerate():
    if thread is not threading.current_thread():
        thread.join()
print("JOINED_ALL_THREADS", len(threading.enumerate()))
