"""DeiT's flags: `--pin-mem` and `--no-pin-mem` share the dest, and `set_defaults` turns
pinning on: the loader pins unless told not to."""

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--num_workers", default=10, type=int)
parser.add_argument("--pin-mem", action="store_true", help="Pin CPU memory in DataLoader")
parser.add_argument("--no-pin-mem", action="store_false", dest="pin_mem")
parser.set_defaults(pin_mem=True)


def main(args, dataset, model, optimizer):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(
        dataset,
        batch_size=64,
        sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=args.pin_mem,
    )
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parser.parse_args(), None, None, None)
