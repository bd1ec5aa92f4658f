# Judge 22, FP1: `net.cpu()` once after the training loop, only to take state_dict() for
# saving (BiSeNet's old/train.py): DDP never runs again, no GD402. A move before the loop,
# one inside it, and one followed by a second training phase keep it.
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from model import SegNet
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def loader():
    ds = TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 19, (64, 32, 32)))
    sampler = DistributedSampler(ds)
    dl = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)
    return dl, sampler


def step(net, optim, im, lb):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(net(im), lb)
    optim.zero_grad()
    loss.backward()
    optim.step()


def train(local_rank, max_iter):
    dl, sampler = loader()
    net = SegNet(19).cuda()
    net = DDP(net, device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    diter = iter(dl)
    epoch = 0
    for _it in range(max_iter):
        try:
            im, lb = next(diter)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            diter = iter(dl)
            im, lb = next(diter)
        step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))

    # dump the final model
    net.cpu()
    state = net.module.state_dict() if hasattr(net, "module") else net.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, "model_final.pth")


def train_then_finetune(local_rank, max_iter):
    dl, sampler = loader()
    net = DDP(SegNet(19).cuda(), device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    for epoch in range(max_iter):
        sampler.set_epoch(epoch)
        for im, lb in dl:
            step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))
    net.half()  # expect: GD402
    for im, lb in dl:
        step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))


def train_moved_inside(local_rank, max_iter):
    dl, sampler = loader()
    net = DDP(SegNet(19).cuda(), device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    for epoch in range(max_iter):
        sampler.set_epoch(epoch)
        for im, lb in dl:
            step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))
        net.cpu()  # expect: GD402
        if dist.get_rank() == 0:
            torch.save(net.module.state_dict(), f"epoch{epoch}.pth")
        net.cuda()  # expect: GD402


def evaluate(net, dl):
    with torch.no_grad():
        return [net(im.cuda(non_blocking=True)).argmax(1) for im, _ in dl]


def train_then_evaluate(local_rank, max_iter):
    dl, sampler = loader()
    net = DDP(SegNet(19).cuda(), device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    for epoch in range(max_iter):
        sampler.set_epoch(epoch)
        for im, lb in dl:
            step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))
    net.float()  # expect: GD402
    state = net.module.state_dict() if hasattr(net, "module") else net.state_dict()
    evaluate(net, dl)
    if dist.get_rank() == 0:
        torch.save(state, "model_final.pth")


def train_returns_moved(local_rank, max_iter):
    dl, sampler = loader()
    net = DDP(SegNet(19).cuda(), device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    for epoch in range(max_iter):
        sampler.set_epoch(epoch)
        for im, lb in dl:
            step(net, optim, im.cuda(non_blocking=True), lb.cuda(non_blocking=True))
    net.double()  # expect: GD402
    return net


if __name__ == "__main__":
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    train(local_rank, 80000)
    train_then_finetune(local_rank, 10)
    train_moved_inside(local_rank, 10)
    train_then_evaluate(local_rank, 10)
    train_returns_moved(local_rank, 10)
    dist.destroy_process_group()
