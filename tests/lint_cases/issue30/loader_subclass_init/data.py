# Judge 22, FP3 (picotron's MicroBatchDataLoader): a project DataLoader subclass whose own
# __init__ builds the DistributedSampler and passes it, with pin_memory (default True), to
# super().__init__: the instance call names neither, the loader has both (no GD201, GD204).
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class TokenChunks(Dataset):
    def __init__(self, path, seq_length):
        self.ids = torch.load(path)
        self.seq_length = seq_length

    def __getitem__(self, index):
        start = index * self.seq_length
        return self.ids[start : start + self.seq_length + 1]

    def __len__(self):
        return len(self.ids) // self.seq_length - 1


class MicroBatchDataLoader(DataLoader):
    def __init__(self, micro_batch_size, seq_length, path, num_workers, pin_memory=True):
        self.seq_length = seq_length
        self.dataset_ = TokenChunks(path, seq_length)
        self.sampler_ = DistributedSampler(
            self.dataset_, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False
        )
        super().__init__(
            self.dataset_,
            batch_size=micro_batch_size,
            collate_fn=self.collate_batch,
            pin_memory=pin_memory,
            num_workers=num_workers,
            sampler=self.sampler_,
            shuffle=False,
        )

    def collate_batch(self, batch):
        stacked = torch.stack(batch)
        return {"input_ids": stacked[:, :-1], "target_ids": stacked[:, 1:]}


class PlainChunkLoader(DataLoader):
    """Control: passes no sampler, and pin_memory is off unless the caller turns it on."""

    def __init__(self, dataset, batch_size, pin_memory=False):
        super().__init__(dataset, batch_size=batch_size, shuffle=True, pin_memory=pin_memory)
