import random

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp


def main(args):
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)  # expect: GD405
        cudnn.deterministic = True
    mp.spawn(main_worker, nprocs=2, args=(args,))


def main_worker(gpu, args):
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", rank=gpu, world_size=2)
    dist.destroy_process_group()
