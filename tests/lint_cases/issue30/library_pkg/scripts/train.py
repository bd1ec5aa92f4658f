import torch
import torch.distributed as dist
from mylib import make_sampler, setup_dist


def main(local_rank, dataset, loader, model, optimizer):
    setup_dist(local_rank)
    sampler = make_sampler(dataset)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()
