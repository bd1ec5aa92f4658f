import torch
import torch.distributed as dist


def save(model, path):
    torch.save(model.state_dict(), path)  # only ever called on rank 0


def save_if_main(model, path):
    if dist.get_rank() != 0:
        return
    torch.save(model.state_dict(), path)


def train(model, epochs, is_main_process):
    dist.init_process_group("gloo")
    for epoch in range(epochs):
        if dist.get_rank() == 0:
            save(model, f"ckpt_{epoch}.pt")
        save_if_main(model, "last.pt")
        if is_main_process:
            model.save_pretrained("out")


def legacy(model, args):
    dist.init_process_group("gloo")
    if args.local_rank in [-1, 0]:
        torch.save(model.state_dict(), "model.pt")
    dist.destroy_process_group()
    dist.destroy_process_group()
