# Judge 22, FP5 (DiffDock's utils/training.py): `inference_epoch` runs the model over a few
# validation complexes every few epochs of training; its local `loader` is not the `loader`
# that `train_epoch` trains over. Its copies stall no training step: no GD204.
import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader


def train_epoch(model, loader, optimizer, device):
    model.train()
    for data in loader:
        data = data.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(data).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def inference_epoch(model, complex_graphs, device, samples):
    model.eval()
    loader = DataLoader(complex_graphs, batch_size=1, shuffle=False)
    rmsds = []
    for graph in loader:
        copies = [copy.deepcopy(graph) for _ in range(samples)]
        with torch.no_grad():
            preds = [model(c.to(device)) for c in copies]
        rmsds.append(torch.stack(preds).float().std())
    return torch.stack(rmsds)


def finetune_epoch(model, examples, optimizer, device):
    """Control: a local loader that a step loop of its own function trains over."""
    loader = DataLoader(examples, batch_size=4, shuffle=True, num_workers=2)  # expect: GD204
    for data in loader:
        loss = nn.functional.mse_loss(model(data.to(device, non_blocking=True)), data.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
