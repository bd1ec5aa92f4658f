import torch
from torch.nn.parallel import DistributedDataParallel


def build(m, rank):
    return DistributedDataParallel(m, device_ids=[rank])


def train(model, loader, sampler, rank, epochs, criterion):
    model = DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x in loader:
            x = x.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(x))
            opt.zero_grad()
            loss.backward()
            opt.step()


def fit(model, loader, sampler, epochs, criterion):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x in loader:
            x = x.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(x))
            opt.zero_grad()
            loss.backward()
            opt.step()
