# CodeBERT code2nl (judge 19, F3): a DistributedSampler's loader wrapped in itertools.cycle;
# there is no epoch loop, so the fix is a generator calling set_epoch before each pass.
import os
from itertools import cycle

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(256, 8))
    sampler = DistributedSampler(data)  # expect: GD202
    train_loader = DataLoader(data, sampler=sampler, batch_size=8, num_workers=2, pin_memory=True)
    batches = cycle(train_loader)
    for _ in range(1000):
        (x,) = next(batches)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x.cuda(non_blocking=True)).float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
