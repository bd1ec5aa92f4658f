import torch
import utils


def train(model, loader, optimizer, scaler):
    for batch in loader:
        images, target = utils.to_device(batch)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(images), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
