import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def run(rank, seed):
    dist.init_process_group("nccl")
    torch.manual_seed(seed)
    torch.cuda.set_device(rank)
    model = DistributedDataParallel(torch.nn.Linear(80, 1).cuda(), device_ids=[rank])
    optim = torch.optim.AdamW(model.parameters(), lr=2e-4)
    for _ in range(1000):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(16, 80, device="cuda")).abs().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    dist.destroy_process_group()
