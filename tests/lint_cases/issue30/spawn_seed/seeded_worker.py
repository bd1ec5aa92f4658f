# The worker seeds itself (through a helper): the parent's seed is only a default.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(args):
    torch.manual_seed(args.seed)
    mp.spawn(main_worker, nprocs=2, args=(args,))


def seed_all(seed):
    torch.manual_seed(seed)


def main_worker(gpu, args):
    seed_all(args.seed + gpu)
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", rank=gpu, world_size=2)
    dist.destroy_process_group()
