import torch.distributed as dist


def train(model, loader, optimizer, log_every):
    dist.init_process_group("gloo")
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            dist.all_reduce(loss.detach())
    total = loss.detach()
    dist.all_reduce(total)  # after the loop
    dist.destroy_process_group()
