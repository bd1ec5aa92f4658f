# Judge 20, L1: a dataset split by rank by hand needs no DistributedSampler: Subset over
# range(rank, len, world_size), a file list sliced [rank::world_size], random_split(...)[rank].
# Control: a Subset that every rank takes whole still gets GD201.
import os
from pathlib import Path

import torch
import torch.distributed as dist
from clip_data import Clips  # one clip file per item
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, random_split

rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
world = dist.get_world_size()
files = sorted(Path("files.txt").read_text().split())
cv_set = Clips(files)
cv_set = Subset(cv_set, list(range(rank, len(cv_set), world)))
by_range = DataLoader(cv_set, batch_size=1, num_workers=4, pin_memory=True)
mine = files[rank::world]
by_slice = DataLoader(Clips(mine), batch_size=1, num_workers=4, pin_memory=True)
parts = random_split(Clips(files), [len(files) // world] * world)
by_split = DataLoader(parts[rank], batch_size=1, num_workers=4, pin_memory=True)
whole = Subset(Clips(files), range(0, len(files)))
everyone = DataLoader(whole, batch_size=1, num_workers=4, pin_memory=True)  # expect: GD201
model = DistributedDataParallel(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
dist.destroy_process_group()
