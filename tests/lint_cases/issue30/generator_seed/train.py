# maskrcnn-benchmark and awesome-semantic-segmentation (thirteenth judges): the only
# manual_seed is a sampler's own generator's; the job itself is never seeded.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class ShardSampler(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])  # expect: GD405
    data = torch.randn(64, 8)
    sampler = ShardSampler(64)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)  # expect: GD204
    for x in loader:
        model(x.cuda()).mean().backward()  # expect: GD601
    dist.destroy_process_group()
