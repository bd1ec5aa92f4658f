import torch


def train(model, loader, optimizer):
    # CPU training: no GPU job, no mixed-precision advice
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
