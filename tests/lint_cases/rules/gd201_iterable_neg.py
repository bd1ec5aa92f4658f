import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset


class ShardedStream(IterableDataset):
    """Shards itself by rank: a sampler does not apply to an IterableDataset."""

    def __init__(self, files):
        self.files = files[dist.get_rank() :: dist.get_world_size()]

    def __iter__(self):
        yield from self.files


def main(files):
    dist.init_process_group("gloo")
    stream = ShardedStream(files)
    loader = DataLoader(stream, batch_size=8)
    for batch in loader:
        print(len(batch)) if dist.get_rank() == 0 else None
    dist.destroy_process_group()
