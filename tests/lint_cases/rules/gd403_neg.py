import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    return local_rank


def main():
    local_rank = setup()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[local_rank])
    dist.destroy_process_group()
    return model
