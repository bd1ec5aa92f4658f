import torch.distributed as dist


def train(model, loader, optimizer):
    dist.init_process_group("gloo")
    for batch in loader:
        loss = model(batch).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # expect: GD704
        optimizer.step()
        dist.all_reduce(loss.detach())  # expect: GD704
    dist.destroy_process_group()
