import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train(loader):
    for x in loader:
        with torch.no_grad():
            target = model.module(x.cuda(non_blocking=True))
        loss = (model(x.cuda(non_blocking=True)) - target).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.save(model.module.state_dict(), "last.pt")
