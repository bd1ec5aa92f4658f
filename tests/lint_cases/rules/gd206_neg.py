from torch.utils.data import DataLoader, DistributedSampler


def loader(dataset):
    a = DataLoader(dataset, sampler=DistributedSampler(dataset), shuffle=False)
    b = DataLoader(dataset, sampler=None, shuffle=True)
    return a, b
