"""Eighteenth judge, M2 (XLM's transformer, NBFNet-PyG's models): `model(x, idx)` of a
project nn.Module, plain or wrapped in DDP, runs its `forward` every step: the asserts that
read a tensor there are host syncs. A module the linter cannot resolve to one project class
(`getattr(self, name)`), and a forward no step loop calls, are not followed (the controls)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, idx):
        assert (idx[:, [0]] == idx).all()  # expect: GD301
        assert idx.max().item() < 4  # expect: GD301
        return self.lin(x)


class Probe(torch.nn.Module):
    def forward(self, x):
        assert x.max().item() < 4
        return x


def main():
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    model = DDP(Net().cuda(), device_ids=[0])
    probe = Probe().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        x = torch.randn(8, 4, device="cuda")
        idx = torch.zeros(8, 3, dtype=torch.long, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, idx).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    probe(torch.randn(8, 4, device="cuda"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
