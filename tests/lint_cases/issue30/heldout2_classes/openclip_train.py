"""OpenCLIP: an every-N-steps schedule and a rank-0 check held in names."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def is_master(args):
    return args.rank == 0


def train_one_epoch(model, loader, optimizer, args):
    for i, images in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(images.cuda(non_blocking=True)).mean()
        loss.backward()
        optimizer.step()
        is_console_step = i % args.log_every_n_steps == 0
        is_metric_step = (i % args.metric_every == 0) or is_console_step
        if is_metric_step:
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            if is_master(args):
                print(reduced.item())
        if i % args.log_every_n_steps == 0:
            args.logged += 1
        else:
            loss.item()  # expect: GD301
        if len(args.history) == 0:  # the first step only
            args.history.append(loss.item())
        past_warmup = i > args.warmup  # every step after the warm-up: not occasional
        if past_warmup:
            dist.all_reduce(loss.detach())  # expect: GD704


def main(args, model, loader, sampler, optimizer):
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = DDP(model.cuda(), device_ids=[args.local_rank])
    args.save_logs = args.logs and args.logs.lower() != "none" and is_master(args)
    args.has_logs = args.logs is not None  # true on every rank
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train_one_epoch(model, loader, optimizer, args)
        if args.save_logs:
            torch.save(model.state_dict(), f"epoch_{epoch}.pt")
        if args.has_logs:
            torch.save(model.state_dict(), "latest.pt")  # expect: GD701
    dist.destroy_process_group()
