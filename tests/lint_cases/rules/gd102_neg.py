import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import replicate

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = nn.Linear(8, 8).cuda()
mine = [local_rank]
(replica,) = replicate(model, mine)  # one device: nothing is copied to other GPUs
if dist.get_rank() == 0:  # one rank evaluates over every GPU
    replicas = replicate(model, list(range(torch.cuda.device_count())))
dist.destroy_process_group()
