from torch.utils.data import DataLoader, DistributedSampler


def loader(dataset):
    return DataLoader(dataset, sampler=DistributedSampler(dataset), shuffle=True)  # expect: GD206
