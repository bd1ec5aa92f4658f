import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[local_rank])  # expect: GD403
    torch.cuda.set_device(local_rank)  # too late: after DDP
    dist.destroy_process_group()
    return model
