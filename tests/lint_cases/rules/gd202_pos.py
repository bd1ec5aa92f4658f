from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def loaders(dataset):
    sampler = DistributedSampler(dataset, shuffle=True)  # expect: GD202
    return DataLoader(dataset, sampler=sampler, batch_size=16)
