"""`if step % 2 == 0:` runs on every other step: a collective or a sync there is per-step
work (a literal period of at most 4). `% 100` and a period from an option
(`% args.log_every`, the remedy the messages propose) stay occasional."""

import torch
import torch.distributed as dist


def train(args, model, loader, optimizer):
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    running = torch.zeros((), device="cuda")
    history = []
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        running += loss.detach()
        if step % 2 == 0:
            dist.all_reduce(running)  # expect: GD704
            seen = running.item()  # expect: GD301
        if (step + 1) % 4 != 0:
            continue
        dist.all_reduce(running)  # expect: GD704
        if step % 100 == 0:
            dist.all_reduce(running)
            history.append(running.item() / dist.get_world_size())
        if step % args.log_every == 0:
            history.append((loss.item(), seen))
    dist.destroy_process_group()
    return history
