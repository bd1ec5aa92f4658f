"""Twenty-first judge, M1: the model class is defined here, built in main.py and wrapped in
DDP by engine.py, which receives it as a parameter. Its forward runs every step."""

import torch
import torch.distributed as dist


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.abs().max().item() > 1e4:  # expect: GD301
            x = x.clamp(-1e4, 1e4)
        return self.lin(x)


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        torch.cuda.synchronize()  # expect: GD301
        return self.lin(x)


class Student(torch.nn.Module):
    """Handed to `fit` by one caller, Teacher by the other: `fit`'s model is not one class,
    so neither forward is followed from there (the control)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        assert x.isfinite().all().item()
        return self.lin(x)


class Teacher(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        print(x.norm().item())
        return self.lin(x)


class CenterLoss(torch.nn.Module):
    """DINO's DINOLoss: the all-reduced batch center is an EMA buffer that forward
    subtracts, which must agree across ranks: a required collective, not GD704."""

    def __init__(self):
        super().__init__()
        self.register_buffer("center", torch.zeros(1, 4))

    def forward(self, out):
        loss = ((out - self.center) ** 2).mean()
        self.update_center(out)
        return loss

    @torch.no_grad()
    def update_center(self, out):
        batch_center = torch.sum(out, dim=0, keepdim=True)
        dist.all_reduce(batch_center)
        batch_center = batch_center / (len(out) * dist.get_world_size())
        self.center = self.center * 0.9 + batch_center * 0.1


class MeanLoss(torch.nn.Module):
    """A loss averaged over the ranks every step for its value only: still GD704."""

    def forward(self, out):
        loss = out.pow(2).mean()
        total = loss.detach().clone()
        dist.all_reduce(total)  # expect: GD704
        self.last = total / dist.get_world_size()
        return loss
