import contextlib

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, optimizer, accumulation_steps=4):
    dist.init_process_group("gloo")
    model = DDP(model)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % accumulation_steps == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss = (model(x) - y).pow(2).mean() / accumulation_steps
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


def no_accumulation(model, loader, optimizer):
    for x, y in loader:
        (model(x) - y).pow(2).mean().backward()
        optimizer.step()
