import torch


class Packed(torch.utils.data.IterableDataset):
    """Packs samples of a per-rank shard into fixed-length sequences."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        yield from self.samples


class Windows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(8)
