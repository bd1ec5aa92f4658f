import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(42)
model = DistributedDataParallel(nn.Linear(4, 4))
dist.destroy_process_group()
