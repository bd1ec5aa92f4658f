import torch


def to_device(batch):
    return [t.cuda(non_blocking=True) for t in batch]


def init_distributed_mode():
    torch.cuda.set_device(0)
