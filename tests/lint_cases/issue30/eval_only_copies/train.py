# Judge 21, D2 and D3: evaluation-only loops and loaders stall no training step, as GD204
# already decided: no GD205 on a blocking copy in `@torch.no_grad() def evaluate` (doctr),
# no GD203 on rank-0 evaluation loaders (ogb's valid / test-dev loaders). The training
# loader and loop keep both.
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler


class Files(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __getitem__(self, index):
        return torch.load(self.paths[index])

    def __len__(self):
        return len(self.paths)


@torch.no_grad()
def evaluate(model, device, loader):
    model.eval()
    total = torch.zeros((), device=device)
    for images, targets in loader:
        images = images.to(device)
        total += (model(images).argmax(1) == targets.to(device, non_blocking=True)).sum()
    return total


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(10, 10).to(device), device_ids=[rank])
    train_set, val_set = Files(args.train), Files(args.val)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(  # expect: GD203
        train_set, batch_size=8, sampler=sampler, num_workers=args.num_workers, pin_memory=True
    )
    if rank == 0:
        valid_loader = DataLoader(
            val_set,
            batch_size=8,
            sampler=SequentialSampler(val_set),
            num_workers=args.num_workers,
            pin_memory=True,
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        model.train()
        for images, targets in train_loader:
            images = images.to(device)  # expect: GD205
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(
                    model(images), targets.to(device, non_blocking=True)
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            evaluate(model, device, valid_loader)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--train", nargs="+")
    parser.add_argument("--val", nargs="+")
    main(parser.parse_args())
