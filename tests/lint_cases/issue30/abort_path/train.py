import math
import sys

import torch


def train_one_epoch(model, loader, optimizer):
    for images, _ in loader:
        loss = model(images.cuda(non_blocking=True)).mean()
        if not math.isfinite(loss.item()):  # expect: GD301
            print(f"Loss is {loss.item()}, stopping training")
            sys.exit(1)
        with torch.autocast("cuda"):
            loss.backward()
        optimizer.step()
