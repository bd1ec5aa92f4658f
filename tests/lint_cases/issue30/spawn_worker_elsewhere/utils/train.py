import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(rank, world_size, seed):
    dist.init_process_group(
        "nccl", init_method="tcp://localhost:54321", rank=rank, world_size=world_size
    )
    torch.cuda.manual_seed(seed)
    torch.cuda.set_device(rank)
    device = torch.device(f"cuda:{rank}")
    model = DistributedDataParallel(torch.nn.Linear(80, 1).to(device), device_ids=[rank])
    optim = torch.optim.AdamW(model.parameters(), lr=2e-4)
    for _ in range(1000):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(16, 80, device=device)).abs().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    dist.destroy_process_group()
