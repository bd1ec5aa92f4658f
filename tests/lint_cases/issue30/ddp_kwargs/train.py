# Judge 21, F4: `device_ids` reaches DDP through the `**` dict: the function stores it
# into its own **kwargs (Pointcept's create_ddp_model), a dict literal or `dict(...)` holds
# it: no GD404. A dict that holds no device_ids keeps GD404.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def create_ddp_model(model, **kwargs):
    if "device_ids" not in kwargs:
        kwargs["device_ids"] = [int(os.environ["LOCAL_RANK"])]
    return DistributedDataParallel(model, **kwargs)


def literal_options(model, rank):
    options = {"device_ids": [rank], "broadcast_buffers": False}
    return DistributedDataParallel(model, **options)


def called_options(model, rank):
    return DistributedDataParallel(model, **dict(device_ids=[rank], static_graph=True))


def missing_options(model):
    options = dict(broadcast_buffers=False)
    return DistributedDataParallel(model, **options)  # expect: GD404


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = create_ddp_model(torch.nn.Linear(10, 10).cuda(), broadcast_buffers=False)
    second = literal_options(torch.nn.Linear(10, 10).cuda(), local_rank)
    third = called_options(torch.nn.Linear(10, 10).cuda(), local_rank)
    fourth = missing_options(torch.nn.Linear(10, 10).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 10, device="cuda")).sum()
            loss = loss + second(torch.randn(4, 10, device="cuda")).sum()
            loss = loss + third(torch.randn(4, 10, device="cuda")).sum()
            loss = loss + fourth(torch.randn(4, 10, device="cuda")).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
