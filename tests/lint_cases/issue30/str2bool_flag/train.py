"""A boolean option parsed by a converter, off by default (`type=str2bool, default=False`):
opt-in like `store_true`, so the syncs it guards were asked for. One defaulting to True is
on unless turned off: its sync is reported (the control)."""

import argparse

import torch
import torch.distributed as dist


def str2bool(v):
    return str(v).lower() in ("yes", "true", "t", "1")


parser = argparse.ArgumentParser()
parser.add_argument("--profile_sync", type=str2bool, default=False, help="time each step")
parser.add_argument("--print_loss", type=str2bool, default=True)


def train(args, model, loader, optimizer):
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    timed = []
    for x, _ in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x.cuda(non_blocking=True)).mean()
        loss.backward()
        optimizer.step()
        if args.profile_sync:
            torch.cuda.synchronize()
            timed.append(loss.item())
        if args.print_loss:
            print("loss", loss.item())  # expect: GD301 GD702
    dist.destroy_process_group()
    return timed


if __name__ == "__main__":
    train(parser.parse_args(), None, None, None)
