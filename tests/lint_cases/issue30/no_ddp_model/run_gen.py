"""CodeT5-style fine-tuning: with --local_rank it initialises a process group and shards
the data, but never wraps the model in DDP: nothing is all-reduced, so GD602's
"all-reduced every micro-step" does not apply."""

import argparse

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    args = parser.parse_args()
    if args.local_rank == -1:
        device = torch.device("cuda")
    else:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
        torch.distributed.init_process_group(backend="nccl")
    torch.manual_seed(1234)
    model = torch.nn.Linear(128, 2).to(device)
    if args.local_rank == -1 and torch.cuda.device_count() > 1:
        model = torch.nn.DataParallel(model)  # expect: GD101
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    train_data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 2, (4096,)))
    if args.local_rank == -1:
        sampler = RandomSampler(train_data)
    else:
        sampler = DistributedSampler(train_data)
    loader = DataLoader(train_data, sampler=sampler, batch_size=32, num_workers=4, pin_memory=True)
    for epoch in range(3):
        if args.local_rank != -1:
            sampler.set_epoch(epoch)
        for step, (source_ids, labels) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(source_ids.to(device, non_blocking=True))
                loss = torch.nn.functional.cross_entropy(
                    logits, labels.to(device, non_blocking=True)
                )
            loss = loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    if args.local_rank != -1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
