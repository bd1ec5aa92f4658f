"""univnet-style data helpers: the DDP trainer imports its loaders from here."""

import torch
from torch.utils.data import DataLoader, Dataset


class MelFromDisk(Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        audio = torch.load(self.files[idx])
        return audio, audio.abs()


def create_dataloader(files, batch_size, num_workers):
    # the training loader of a DDP job, without a DistributedSampler
    return DataLoader(  # expect: GD201
        MelFromDisk(files),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        pin_memory=True,
        drop_last=True,
    )


def create_valloader(files, num_workers):
    return DataLoader(MelFromDisk(files), batch_size=1, num_workers=num_workers, pin_memory=True)


def create_loader(files, train, workers=4):
    """univnet's own shape: the train and the validation loader from one helper."""
    dataset = MelFromDisk(files)
    if train:
        return DataLoader(dataset, 16, num_workers=workers, pin_memory=True)  # expect: GD201
    else:
        return DataLoader(dataset, 1, num_workers=workers, pin_memory=True)
