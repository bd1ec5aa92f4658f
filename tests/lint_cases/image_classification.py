"""ResNet-50 on an ImageFolder dataset with torchrun: a typical loop with typical mistakes."""

import argparse
import os

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/data/imagenet")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=64)
    return parser.parse_args()


def build_loaders(data_dir, batch_size):
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_set = torchvision.datasets.ImageFolder(
        os.path.join(data_dir, "train"),
        transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor(), normalize]),
    )
    val_set = torchvision.datasets.ImageFolder(
        os.path.join(data_dir, "val"),
        transforms.Compose(
            [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
        ),
    )
    train_sampler = DistributedSampler(train_set)  # expect: GD202
    train_loader = DataLoader(
        train_set, batch_size=batch_size, sampler=train_sampler, num_workers=8, pin_memory=True
    )
    val_loader = DataLoader(val_set, batch_size=batch_size, num_workers=8, pin_memory=True)
    return train_loader, val_loader


def train_one_epoch(model, loader, criterion, optimizer, scaler, device):
    model.train()
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        dist.barrier()  # expect: GD703


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for images, target in loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            pred = model(images).argmax(dim=1)
            correct += (pred == target).sum().item()  # expect: GD303
            total += target.numel()
    return correct / total


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    torch.manual_seed(0)
    device = torch.device("cuda", local_rank)

    model = torchvision.models.resnet50().to(device)
    model = DistributedDataParallel(  # expect: GD401
        model, device_ids=[local_rank], find_unused_parameters=True
    )
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    train_loader, val_loader = build_loaders(args.data, args.batch_size)

    for epoch in range(args.epochs):
        train_one_epoch(model, train_loader, criterion, optimizer, scaler, device)
        accuracy = evaluate(model, val_loader, device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: top-1 {accuracy:.3f}")
        torch.save(model.module.state_dict(), f"checkpoint_{epoch}.pt")  # expect: GD701

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
