import builtins

import torch
import torch.distributed as dist


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args):
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl")
    setup_for_distributed(args.rank == 0)
