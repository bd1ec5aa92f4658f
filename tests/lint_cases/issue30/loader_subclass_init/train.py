import os

import torch
import torch.distributed as dist
import torch.nn as nn
from data import MicroBatchDataLoader, PlainChunkLoader, TokenChunks
from torch.nn.parallel import DistributedDataParallel as DDP


def train_step(model, optimizer, batch, device):
    input_ids = batch["input_ids"].to(device, non_blocking=True)
    target_ids = batch["target_ids"].to(device, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), target_ids.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    data_loader = MicroBatchDataLoader(
        micro_batch_size=4, seq_length=1024, path="tokens.pt", num_workers=2
    )
    extra_loader = PlainChunkLoader(TokenChunks("extra.pt", 1024), 4)  # expect: GD201 GD203 GD204
    model = nn.Sequential(nn.Embedding(50257, 256), nn.Linear(256, 50257)).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for batch in data_loader:
        train_step(model, optimizer, batch, device)
    for batch in extra_loader:
        train_step(model, optimizer, batch, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
