import os

import torch
import torch.distributed as dist
import utils
from engine import train_one_epoch


def main(args, model, dataset, optimizer):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[local_rank])
    sampler = torch.utils.data.DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(
        dataset, sampler=sampler, batch_size=64, num_workers=8, pin_memory=True
    )
    log_writer = None
    if dist.get_rank() == 0 and args.log_dir is not None:
        log_writer = utils.TensorboardLogger(log_dir=args.log_dir)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train_one_epoch(model, loader, optimizer, log_writer=log_writer)
    dist.destroy_process_group()
