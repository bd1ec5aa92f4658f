"""A carefully written DDP training script (torchrun): gpudiag lint must find nothing here."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS = 10
ACCUM_STEPS = 4
LOG_EVERY = 100


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Dropout(0.1), nn.Linear(2048, 10))


def make_loader(dataset: TensorDataset, shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    sampler = DistributedSampler(dataset, shuffle=shuffle, drop_last=shuffle)
    loader = DataLoader(
        dataset,
        batch_size=128,
        sampler=sampler,
        num_workers=4,
        pin_memory=True,
        persistent_workers=True,
    )
    return loader, sampler


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    correct = torch.zeros((), device=device)
    seen = torch.zeros((), device=device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for inputs, labels in loader:
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            correct += (model(inputs).argmax(dim=1) == labels).sum()
            seen += labels.numel()
    dist.all_reduce(correct)
    dist.all_reduce(seen)
    model.train()
    return (correct / seen).item()


def train(
    model: DDP,
    train_loader: DataLoader,
    sampler: DistributedSampler,
    val_loader: DataLoader,
    device: torch.device,
) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    criterion = nn.CrossEntropyLoss()
    rank = dist.get_rank()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        running = torch.zeros((), device=device)
        for step, (inputs, labels) in enumerate(train_loader):
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            last_micro_step = (step + 1) % ACCUM_STEPS == 0
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if last_micro_step:
                    loss = criterion(model(inputs), labels) / ACCUM_STEPS
                    loss.backward()
                else:
                    with model.no_sync():
                        loss = criterion(model(inputs), labels) / ACCUM_STEPS
                        loss.backward()
            if last_micro_step:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            running += loss.detach()
            if step % LOG_EVERY == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {running.item() / (step + 1):.4f}")
        accuracy = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: accuracy {accuracy:.3f}")
            torch.save(model.module.state_dict(), "checkpoint.pt")
        dist.barrier()


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    torch.manual_seed(0)
    device = torch.device("cuda", local_rank)
    try:
        model = DDP(build_model().to(device), device_ids=[local_rank])
        train_set = TensorDataset(torch.randn(50_000, 512), torch.randint(0, 10, (50_000,)))
        val_set = TensorDataset(torch.randn(5_000, 512), torch.randint(0, 10, (5_000,)))
        train_loader, sampler = make_loader(train_set, shuffle=True)
        val_loader, _ = make_loader(val_set, shuffle=False)
        train(model, train_loader, sampler, val_loader, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
