import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, optimizer, accumulation_steps=4):
    dist.init_process_group("gloo")
    model = DDP(model)
    for i, (x, y) in enumerate(loader):
        loss = (model(x) - y).pow(2).mean() / accumulation_steps
        loss.backward()  # expect: GD602
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()
