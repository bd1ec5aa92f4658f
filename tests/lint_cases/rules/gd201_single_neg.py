from torch.utils.data import DataLoader


def single_process(dataset):
    # not DDP code: no sampler needed
    return DataLoader(dataset, batch_size=32, shuffle=True)
