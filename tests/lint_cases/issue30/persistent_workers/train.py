# wenet (fifteenth judge): num_workers from an option whose default is 0, in a DataLoader
# that also passes persistent_workers=True / prefetch_factor: DataLoader raises with 0
# workers, so no run that starts loads in the main process (was GD203).
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets

p = argparse.ArgumentParser()
p.add_argument("--num_workers", type=int, default=0)
args = p.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
torch.manual_seed(0)
ds = datasets.ImageFolder("train")
sampler = DistributedSampler(ds)
loader = DataLoader(
    ds,
    batch_size=32,
    sampler=sampler,
    pin_memory=True,
    num_workers=args.num_workers,
    persistent_workers=True,
)
other = DataLoader(
    ds,
    batch_size=32,
    sampler=sampler,
    pin_memory=True,
    num_workers=args.num_workers,
    prefetch_factor=4,
)
# control: the option's default is 0 and nothing else in the call needs more: reported
plain = DataLoader(  # expect: GD203
    ds, batch_size=32, sampler=sampler, pin_memory=True, num_workers=args.num_workers
)
model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[dist.get_rank()])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for batches in (loader, other, plain):
        for x, _y in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
dist.destroy_process_group()
