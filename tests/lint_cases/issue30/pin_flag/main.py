"""`pin_memory=args.pin_mem` where `--pin_mem` is a `store_true` flag: off unless given, so
the loader does not pin by default (GD204, naming the option). DeiT's pair of flags with
`set_defaults(pin_mem=True)` pins by default and is not reported (the control, in
deit_args.py's own run)."""

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=8)
parser.add_argument("--pin_mem", action="store_true", help="pin CPU memory in the loader")


def main(args, dataset, model, optimizer):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(  # expect: GD204
        dataset,
        batch_size=64,
        sampler=sampler,
        num_workers=args.workers,
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
