import os

import torch
from torch import distributed as dist

dist.init_process_group("nccl")
tensor = torch.ones(4).to(int(os.environ["LOCAL_RANK"])).cuda()
dist.all_reduce(tensor)
dist.destroy_process_group()
