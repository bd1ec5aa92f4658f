import torch
from torch.cuda.amp import GradScaler, autocast


def train(model, loader, optimizer):
    model = model.cuda()
    scaler = GradScaler()
    for x, y in loader:
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
