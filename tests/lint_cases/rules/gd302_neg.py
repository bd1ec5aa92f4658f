import torch


def train(model, optimizer, loader):
    for x in loader:
        model(x.cuda()).sum().backward()
        optimizer.step()
    torch.cuda.empty_cache()  # once, after training
