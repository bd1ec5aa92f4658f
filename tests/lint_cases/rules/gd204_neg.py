from torch.utils.data import DataLoader


def loaders(train_set, pin):
    a = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
    b = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=pin)
    return a, b, "cuda"
