"""Eighteenth judge, M1 (XLM): `trainer` is bound to one of two subclasses, both inheriting
`step` from the project base class `Trainer`: `trainer.step(x)` runs the base class's step,
whose `.item()` is per-step. A method only one of the classes defines (`mt_step` of
EncDecTrainer) is that one, and its `self.optimize(loss)`, inherited, is the base class's
(which makes `mt_step` a step function). A method a subclass overrides differently in each branch is not
followed (which one runs is unknown)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model):
        self.model = DDP(model.cuda(), device_ids=[0])
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.stats = []

    def step(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(x).sum()
        self.stats.append(loss.item())  # expect: GD301
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def optimize(self, loss):
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


class SingleTrainer(Trainer):
    def log(self):
        return self.stats


class EncDecTrainer(Trainer):
    def mt_step(self, x):
        loss = self.model(x).sum()
        self.stats.append(loss.item())  # expect: GD301
        self.optimize(loss)


def main(encoder_only):
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    model = torch.nn.Linear(4, 4)
    if encoder_only:
        trainer = SingleTrainer(model)
    else:
        trainer = EncDecTrainer(model)
    for _ in range(100):
        trainer.step(torch.randn(8, 4, device="cuda"))
    for _ in range(100):
        trainer.mt_step(torch.randn(8, 4, device="cuda"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(True)
