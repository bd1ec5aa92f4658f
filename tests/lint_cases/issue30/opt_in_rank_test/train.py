# Judge 21, D1: an opt-in mode behind `if rank == 0 and args.find_lr:` (doctr's LR finder,
# `--find-lr` store_true) is the user's choice: no GD301 on its abort test, no GD205 on its
# copies. The training loop keeps both.
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def record_lr(model, loader, optimizer, num_it=100):
    losses = []
    for i, (images, targets) in enumerate(loader):
        images = images.cuda()
        loss = torch.nn.functional.cross_entropy(model(images), targets.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not torch.isfinite(loss):
            break
        losses.append(loss.detach())
        if i + 1 == num_it:
            break
    return losses


def train(model, loader, optimizer):
    for images, targets in loader:
        images = images.cuda()  # expect: GD205
        loss = torch.nn.functional.cross_entropy(model(images), targets.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not torch.isfinite(loss):  # expect: GD301
            break


def main(args, dataset):
    rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(10, 10).cuda(), device_ids=[rank])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0 and args.find_lr:
        record_lr(model, loader, optimizer)
        return
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for epoch in range(10):
            sampler.set_epoch(epoch)
            train(model, loader, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--find-lr", action="store_true")
    main(parser.parse_args(), None)
