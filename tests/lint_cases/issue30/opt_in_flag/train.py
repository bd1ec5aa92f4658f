import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--sync-timing", action="store_true", help="synchronise to time each step")
parser.add_argument("--log-loss", action="store_false")


def train(args, model, loader, optimizer):
    for x, _ in loader:
        with torch.autocast("cuda"):
            loss = model(x.cuda()).mean()
        loss.backward()
        optimizer.step()
        if args.sync_timing:
            torch.cuda.synchronize()
        if args.log_loss:
            print(loss.item())  # expect: GD301
