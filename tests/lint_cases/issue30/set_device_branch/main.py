import torch
import torch.distributed as dist


def main_worker(gpu, args, model):
    args.gpu = gpu
    if args.gpu is not None:
        torch.cuda.set_device(args.gpu)
    dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
    torch.manual_seed(0)
    if args.gpu is not None:
        model.cuda(args.gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    else:
        model.cuda()
        model = torch.nn.parallel.DistributedDataParallel(model)  # expect: GD403
    dist.destroy_process_group()
    return model
