# Judge 20, D1: a loader used only for evaluation stalls no training step: no GD204
# (votenet's TEST_DATALOADER; named for evaluation, built in an evaluation function, or
# used only under no_grad / by an evaluation function). A training loader keeps it.
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, split):
        self.paths = [line.strip() for line in Path(split).with_suffix(".txt").open()]

    def __getitem__(self, index):
        return torch.load(self.paths[index])

    def __len__(self):
        return len(self.paths)


device = torch.device("cuda:0")
TRAIN_DATALOADER = DataLoader(Points("train"), 8, shuffle=True, num_workers=4)  # expect: GD204
TEST_DATALOADER = DataLoader(Points("val"), batch_size=8, num_workers=4)
holdout = DataLoader(Points("holdout"), batch_size=8, num_workers=4)
scored = DataLoader(Points("scored"), batch_size=8, num_workers=4)
test_loader = DataLoader(Points("extra"), batch_size=8, num_workers=4)  # expect: GD204
net = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)


def build_val_loader():
    return DataLoader(Points("val2"), batch_size=8, num_workers=4)


def evaluate(loader):
    net.eval()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.cross_entropy(net(x.to(device)), y.to(device))
    return total


def score_all():
    with torch.no_grad():
        return [net(x.to(device)) for x, _ in scored]


for epoch in range(100):
    net.train()
    for x, y in TRAIN_DATALOADER:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(net(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for x, y in test_loader:  # a "test" loader the step loop trains on
        loss = nn.functional.cross_entropy(net(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if epoch % 10 == 9:
        evaluate(TEST_DATALOADER)
        evaluate(holdout)
        evaluate(build_val_loader())
        score_all()
