# Evaluation loops read a metric every batch (DeiT's / ConvNeXt's `evaluate`, a
# `@torch.no_grad()` validation helper): a host sync with no backward to stall.
import torch


@torch.no_grad()
def evaluate(model, data_loader):
    model.eval()
    for images, target in data_loader:
        output = model(images.cuda(non_blocking=True))
        acc = (output.argmax(1) == target.cuda()).float().mean()
        print(acc.item())  # expect: GD303


def validate(model, val_loader):
    correct = 0
    for images, target in val_loader:
        with torch.no_grad():
            pred = model(images.cuda()).argmax(1)
        correct += (pred == target.cuda()).sum().item()  # expect: GD303
    return correct


def train(model, optimizer, train_loader):
    for images, target in train_loader:
        loss = torch.nn.functional.cross_entropy(model(images.cuda()), target.cuda())
        loss.backward()
        optimizer.step()
        print(loss.item())  # expect: GD301
