import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build(local_rank):
    model = nn.Linear(4, 4)
    model.head = nn.Linear(4, 2)
    model = model.to(torch.device("cuda", local_rank)).half()
    ddp = DDP(model, device_ids=[local_rank])
    ddp.train()
    ddp.module.eval()
    criterion = nn.CrossEntropyLoss().to(local_rank)
    return ddp, criterion


def other_function(model):
    model.to("cpu")  # another function's `model`, not the wrapped one
