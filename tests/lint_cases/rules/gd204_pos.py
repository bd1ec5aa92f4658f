from torch.utils.data import DataLoader


def loaders(train_set):
    a = DataLoader(train_set, batch_size=64, num_workers=4)  # expect: GD204
    b = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=False)  # expect: GD204
    return a, b, "cuda"
