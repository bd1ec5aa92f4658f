# P5 (fifteenth judge): the step calls `self.model.module.train_step(batch)`: DDP's forward
# never runs, so no gradient is all-reduced (GD406), and find_unused_parameters, which
# runs in that forward, costs nothing (was GD401).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def train_step(self, x):
        return self.lin(x).pow(2).mean()


class Trainer:
    def __init__(self, rank):
        self.model = DDP(Net().cuda(), device_ids=[rank], find_unused_parameters=True)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        ds = torch.load("data.pt")
        self.sampler = DistributedSampler(ds)
        self.loader = DataLoader(
            ds, batch_size=32, sampler=self.sampler, num_workers=4, pin_memory=True
        )

    def train(self):
        for epoch in range(2):
            self.sampler.set_epoch(epoch)
            for x in self.loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = self.model.module.train_step(x.cuda(non_blocking=True))  # expect: GD406
                loss.backward()
                self.opt.step()
                self.opt.zero_grad()


def rollouts(model, loader, opt):
    """The DDP object runs the step; `.module` only samples and saves: nothing bypassed."""
    for x in loader:
        with torch.no_grad():
            target = model.module.lin(x.cuda(non_blocking=True))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (model(x.cuda(non_blocking=True)) - target).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "ckpt.pt")


if __name__ == "__main__":
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    Trainer(rank).train()
    dist.destroy_process_group()
