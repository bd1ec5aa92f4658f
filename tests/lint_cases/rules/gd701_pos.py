import torch
import torch.distributed as dist


def save(model, path):
    torch.save(model.state_dict(), path)  # expect: GD701


def train(model, epochs):
    dist.init_process_group("gloo")
    for epoch in range(epochs):
        save(model, f"ckpt_{epoch}.pt")
    dist.destroy_process_group()
