import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(4, 4))  # expect: GD405
dist.destroy_process_group()
