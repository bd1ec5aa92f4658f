import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")


def loaders(train_set, val_set):
    train = DataLoader(train_set, batch_size=64, pin_memory=True)  # expect: GD203
    val = DataLoader(val_set, batch_size=64, num_workers=0, pin_memory=True)  # expect: GD203
    return train, val
