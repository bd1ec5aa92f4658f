import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank)
dist.init_process_group("nccl", device_id=device)  # binds the rank to its GPU
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 4).to(device), device_ids=[local_rank])
dist.destroy_process_group()
