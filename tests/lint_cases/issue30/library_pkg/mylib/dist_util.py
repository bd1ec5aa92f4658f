import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


def setup_dist(local_rank):
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")


def make_sampler(dataset):
    return DistributedSampler(dataset)
