"""NVIDIA apex's DistributedDataParallel is DDP: converting the wrapped model to half
precision after wrapping it changes the parameters DDP registered its hooks on (GD402).
apex's wrapper takes no device_ids: no GD404."""

import argparse

import torch
import torch.distributed as dist
import torchvision.models as models
from apex.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0, type=int)
parser.add_argument("--fp16", action="store_true")


def main(args, train_loader, train_sampler):
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    torch.manual_seed(0)
    model = models.resnet50().cuda()
    model = DDP(model, delay_allreduce=True)
    if args.fp16:
        model.half()  # expect: GD402
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss().cuda()
    for epoch in range(90):
        train_sampler.set_epoch(epoch)
        for images, target in train_loader:
            images = images.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
            loss = criterion(model(images.half() if args.fp16 else images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parser.parse_args(), None, None)
