import torch.distributed as dist
from torch.utils.data import DistributedSampler


def samplers(dataset):
    a = DistributedSampler(
        dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False
    )
    b = DistributedSampler(dataset, shuffle=False)
    return a, b
