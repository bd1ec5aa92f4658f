import torch.distributed as dist


def is_main_proc():
    return dist.get_rank() == 0
