import os

import torch
import torch.distributed as dist
import torch.nn as nn
from lib.data import get_aux_loader, get_data_loader, get_extra_loader
from torch.nn.parallel import DistributedDataParallel as DDP


class Cfg:
    root = "data"
    aux_root = "aux"
    extra_root = "extra"
    ims_per_gpu = 8
    eval_ims_per_gpu = 2
    max_iter = 1000


def evaluate(net, dl):
    net.eval()
    with torch.no_grad():
        for im, _lb in dl:
            net(im.cuda(non_blocking=True))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    cfg = Cfg()
    dl = get_data_loader(cfg, mode="train")
    aux, aux_sampler = get_aux_loader(cfg, dist.get_world_size())
    extra = get_extra_loader(cfg, 1)
    net = DDP(nn.Conv2d(3, 19, 1).cuda(), device_ids=[local_rank])
    optim = torch.optim.SGD(net.parameters(), lr=1e-2)
    for im, lb in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(
                net(im.cuda(non_blocking=True)), lb.cuda(non_blocking=True)
            )
        optim.zero_grad()
        loss.backward()
        optim.step()
    for im, lb in extra:
        loss = nn.functional.cross_entropy(
            net(im.cuda(non_blocking=True)), lb.cuda(non_blocking=True)
        )
        optim.zero_grad()
        loss.backward()
        optim.step()
    evaluate(net, get_data_loader(cfg, mode="val"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
