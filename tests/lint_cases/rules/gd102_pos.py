import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import parallel_apply, replicate

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = nn.Linear(8, 8).cuda()
devices = list(range(torch.cuda.device_count()))
replicas = replicate(model, devices)  # expect: GD102
inputs = [torch.randn(4, 8, device=f"cuda:{i}") for i in devices]
with torch.no_grad():
    outputs = parallel_apply(replicas, inputs)
    again = nn.parallel.replicate(model, devices=[0, 1])  # expect: GD102
dist.destroy_process_group()
