"""A careful CPU (gloo) DDP script, launched with mp.spawn: gpudiag lint must find nothing."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def worker(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(
            nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        dataset = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=64, sampler=sampler)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for inputs, targets in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
            if rank == 0:
                print(f"epoch {epoch}: last loss {loss.item():.4f}")
        if rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    mp.spawn(worker, args=(world, int(sys.argv[2])), nprocs=world, join=True)
