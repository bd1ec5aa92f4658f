import torch
from torch.utils.data import DataLoader


def train(model, dataset, optimizer, device="cuda"):
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(torch.float32)  # a dtype cast, not a copy to the device
        loss = (model(x) - y.to(device, non_blocking=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
    model.to(device)  # outside the step loop, not a batch
