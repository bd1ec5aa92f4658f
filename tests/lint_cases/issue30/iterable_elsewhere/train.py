# nanoVLM's train.py (thirteenth judge): the name is first bound to a map-style dataset,
# then to an IterableDataset subclass of another project file, which the loader gets.
import os

import torch
import torch.distributed as dist
from data.packed import Packed, Windows
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_dataset = Windows(64)
    train_dataset = Packed(train_dataset)
    train_loader = DataLoader(train_dataset, batch_size=8, pin_memory=True)  # expect: GD203
    windows = Windows(64)
    more = DataLoader(windows, batch_size=8, pin_memory=True)  # expect: GD201 GD203
    for loader in (train_loader, more):
        for x in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda(non_blocking=True)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()
