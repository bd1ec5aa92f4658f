# Judge 22, FP4 (flow_matching's train_loop.py): `if torch.rand(1) < p:` draws on the CPU,
# its test reads host memory: no GD301. The same draw on the GPU keeps it.
import argparse

import torch
import torch.nn as nn
from losses import score_loss
from torch.utils.data import DataLoader, Dataset


class Poses(Dataset):
    def __init__(self, root):
        self.files = [f"{root}/{i}.pt" for i in range(1000)]

    def __getitem__(self, index):
        return torch.load(self.files[index])

    def __len__(self):
        return len(self.files)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--class_drop_prob", type=float, default=0.2)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Linear(16, 6).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Poses("train"), batch_size=16, num_workers=4, pin_memory=True)
    for x, tr_score, rot_score in loader:
        x = x.to(device, non_blocking=True)
        if torch.rand(1) < args.class_drop_prob:
            x = torch.zeros_like(x)
        if torch.rand(1, device=device) < args.class_drop_prob:  # expect: GD301
            x = x.flip(0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss, tr_loss, rot_loss = score_loss(out[:, :3], tr_score, out[:, 3:], rot_score)
        if torch.any(torch.isnan(loss)):
            print("nan loss, skipping batch")
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logged = loss.cpu().detach()
        gpu_norm = out.float().norm()
        if torch.isnan(gpu_norm):  # expect: GD301
            break
        del logged


if __name__ == "__main__":
    main()
