"""ConvNeXt: three classes define `update`; each call reaches its own class's method."""

import torch
from torch.utils.tensorboard import SummaryWriter


class SmoothedValue:
    def update(self, value, n=1):
        self.total += value * n


class MetricLogger:
    def __init__(self):
        self.meters = {}

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].update(v)


class TensorboardLogger:
    def __init__(self, log_dir):
        self.writer = SummaryWriter(log_dir=log_dir)
        self.step = 0

    def update(self, head="scalar", step=None, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()  # expect: GD301
            self.writer.add_scalar(head + "/" + k, v, self.step if step is None else step)
