from torch.utils.data import DataLoader


def cpu_loader(train_set):
    # no CUDA anywhere in this file: loading in-process is not a GPU stall
    return DataLoader(train_set, batch_size=64)
