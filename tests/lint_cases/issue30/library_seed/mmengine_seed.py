# Judge 21, F3 variant: mmengine's `set_random_seed(seed, deterministic=...)` through a
# module alias seeds torch too: no GD405.
import os

import torch
import torch.distributed as dist
from mmengine import runner
from torch.nn.parallel import DistributedDataParallel as DDP


def main(cfg):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    runner.set_random_seed(cfg.seed, deterministic=False)
    model = DDP(torch.nn.Linear(10, 10).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 10, device="cuda")).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
