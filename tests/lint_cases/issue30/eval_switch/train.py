# CenterNet's shared loop (thirteenth judge): it trains under `if phase == "train":` and,
# in a `--test` run that only evaluates, saves each batch's results.
import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--test", action="store_true")


def save_result(output, results):
    results.append(output.detach().cpu().numpy())  # expect: GD303


def run_epoch(opt, phase, model, loader, optimizer, results):
    for x in loader:
        out = model(x.cuda())
        loss = out.mean()
        if phase == "train":
            optimizer.zero_grad()
            loss.backward()  # expect: GD601
            optimizer.step()
        if opt.test:
            save_result(out, results)


def main():
    opt = parser.parse_args()
    net = torch.nn.Linear(8, 8).cuda()
    model = DDP(net)  # expect: GD403 GD404 GD405
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [torch.randn(8, 8) for _ in range(4)]
    run_epoch(opt, "val" if opt.test else "train", model, loader, optimizer, [])
