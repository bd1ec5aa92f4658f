import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def either(model, local_rank):
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    if torch.cuda.is_available():
        return DDP(model.cuda(local_rank), device_ids=[local_rank])
    return DDP(model)  # the CPU fallback, after an early return on GPU


def branches(model, local_rank, use_cpu):
    if use_cpu:
        return DDP(model)
    else:
        return DDP(model.cuda(local_rank), device_ids=[local_rank])
