import os

import torch
import torch.distributed as dist
from datasets.dataloader import create_loader
from torch.nn.parallel import DistributedDataParallel


def train(rank, files, epochs):
    dist.init_process_group("nccl", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(1234)
    torch.cuda.set_device(rank)
    model = DistributedDataParallel(torch.nn.Linear(80, 80).cuda(), device_ids=[rank])
    optim = torch.optim.AdamW(model.parameters(), lr=2e-4)
    valloader = create_loader(files, False)
    trainloader = create_loader(files, True)
    for _ in range(epochs):
        for audio, mel in trainloader:
            audio = audio.cuda()  # expect: GD205
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = (
                    (model(mel.cuda(non_blocking=True)) - audio.cuda(non_blocking=True))
                    .abs()
                    .mean()
                )
            optim.zero_grad()
            loss.backward()
            optim.step()
        if rank == 0:
            with torch.no_grad():
                for _audio, mel in valloader:
                    model.module(mel.cuda(non_blocking=True))
    dist.destroy_process_group()
