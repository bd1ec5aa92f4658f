from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def run(dataset, val_set, train_epoch):
    sampler = DistributedSampler(dataset)
    val_sampler = DistributedSampler(
        val_set, shuffle=False
    )  # no shuffle: order is meant to be fixed
    loader = DataLoader(dataset, sampler=sampler, batch_size=16)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        train_epoch(loader)
    return val_sampler
