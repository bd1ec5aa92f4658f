"""Eighteenth judge, M4 (ParallelWaveGAN): `pin_memory=config["pin_memory"]` is trusted as
pinned by GD204, so GD205 counts it as pinned too: the blocking copy of its batch is
reported. A store_true option off by default is no pinning for either rule (the control:
GD204 with its detail, no GD205)."""

import argparse

import torch
from torch.utils.data import DataLoader


class Frames(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.load(f"{i}.pt")


def main(config):
    parser = argparse.ArgumentParser()
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    model = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Frames(), batch_size=8, num_workers=4, pin_memory=config["pin_memory"])
    for x in loader:
        x = x.to(device)  # expect: GD205
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flagged = DataLoader(Frames(), 8, num_workers=4, pin_memory=args.pin)  # expect: GD204
    for x in flagged:
        x = x.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        loss.backward()
