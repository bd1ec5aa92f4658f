"""An evaluation script named test.py is not a test module: reported."""

import torch
import torch.nn as nn
from parallel import UserScatteredDataParallel, patch_replication_callback


def main(model, gpus, loader):
    model = nn.DataParallel(model.cuda())  # expect: GD101
    with torch.no_grad():
        for x in loader:
            model(x.cuda())


def train(model, gpus):
    model = UserScatteredDataParallel(model, device_ids=gpus)  # expect: GD101
    patch_replication_callback(model)
    return model
