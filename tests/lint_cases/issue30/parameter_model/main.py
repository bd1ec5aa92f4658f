import os

import torch
import torch.distributed as dist
from engine import build, fit, train
from models import CenterLoss, Head, MeanLoss, Net, Student, Teacher
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main():
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    data = torch.load("data.pt")
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)
    train(Net().cuda(), loader, sampler, rank, 10, CenterLoss().cuda())

    head = build(Head().cuda(), rank)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for x in loader:
            x = x.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = head(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    student = build(Student().cuda(), rank)
    fit(student, loader, sampler, 1, MeanLoss())
    fit(build(Teacher().cuda(), rank), loader, sampler, 1, MeanLoss())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
