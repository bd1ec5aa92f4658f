import torch
from torch.nn.parallel import DistributedDataParallel as DDP

torch.cuda.set_device(0)
model = DDP(torch.nn.Linear(4, 4).cuda())  # expect: GD404
