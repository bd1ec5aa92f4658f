# Every per-step caller passes host numbers: the helper's `.item()` never runs on a tensor.
import torch
from utils import MetricLogger


def train(model, loader, optimizer):
    logger = MetricLogger()
    for samples, _ in loader:
        with torch.autocast("cuda"):
            loss = model(samples.cuda()).mean()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()  # expect: GD301
        logger.update(loss=loss_value, lr=0.1)
