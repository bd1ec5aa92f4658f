import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build(local_rank):
    model = nn.Linear(4, 4)
    ddp = DDP(model)
    ddp.cuda(local_rank)  # expect: GD402
    model.half()  # expect: GD402
    model.head = nn.Linear(4, 2)  # expect: GD402
    return ddp


def rebinding(local_rank):
    model = nn.Linear(4, 4)
    model = DDP(model)
    model.to(torch.device("cuda", local_rank))  # expect: GD402
    return model
