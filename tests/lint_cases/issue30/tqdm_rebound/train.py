"""univnet-style training loop: the pinned loader iterated through a tqdm bar bound to
another name, in an if/else on the rank."""

import torch
import tqdm
from torch.utils.data import DataLoader, Dataset


class MelDataset(Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        audio = torch.load(self.files[i])
        return audio, audio.abs()


def train(rank, files, model, optim, epochs):
    device = torch.device(f"cuda:{rank}")
    trainloader = DataLoader(MelDataset(files), batch_size=16, num_workers=4, pin_memory=True)
    valloader = DataLoader(MelDataset(files), batch_size=1, num_workers=2)  # expect: GD204
    for _ in range(epochs):
        if rank == 0:
            loader = tqdm.tqdm(trainloader, desc="Loading train data")
        else:
            loader = trainloader
        for audio, mel in loader:
            audio = audio.to(device)  # expect: GD205
            mel = mel.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = (model(mel) - audio).abs().mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
        bar = tqdm.tqdm(valloader, desc="validation")  # not pinned: a plain copy is right
        with torch.no_grad():
            for _audio, mel in bar:
                model(mel.to(device))
