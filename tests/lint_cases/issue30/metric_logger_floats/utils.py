from collections import defaultdict

import torch


class MetricLogger:
    def __init__(self, delimiter="\t"):
        self.meters = defaultdict(list)

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].append(v)
