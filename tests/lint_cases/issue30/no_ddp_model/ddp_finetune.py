"""The control: the same loop with the model wrapped in DDP accumulates without no_sync."""

import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main(accum=4):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl")
    torch.manual_seed(1234)
    model = DDP(torch.nn.Linear(128, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    train_data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 2, (4096,)))
    sampler = DistributedSampler(train_data)
    loader = DataLoader(train_data, sampler=sampler, batch_size=32, num_workers=4, pin_memory=True)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, (source_ids, labels) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(source_ids.cuda(non_blocking=True))
                loss = torch.nn.functional.cross_entropy(logits, labels.cuda(non_blocking=True))
            (loss / accum).backward()  # expect: GD602
            if (step + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    torch.distributed.destroy_process_group()
