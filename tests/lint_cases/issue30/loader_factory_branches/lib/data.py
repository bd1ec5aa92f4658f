# Judge 22, FP2 (BiSeNet's lib/data/get_dataloader.py): a loader factory with a
# distributed branch and a single-process one. The `else:` of `if dist.is_initialized():`
# runs only without a process group: no GD201 there. The evaluation sampler gets
# `shuffle=shuffle`, and on its branch (`mode != "train"`) `shuffle` is False: no GD202.
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Scenes(Dataset):
    def __init__(self, root, mode):
        self.files = sorted(f"{root}/{mode}/{i}.pt" for i in range(1000))

    def __getitem__(self, index):
        return torch.load(self.files[index])

    def __len__(self):
        return len(self.files)


class RepeatedSampler(DistributedSampler):
    def __init__(self, dataset, num_imgs, shuffle=True):
        super().__init__(dataset, shuffle=shuffle)
        self.num_imgs = num_imgs


def get_data_loader(cfg, mode="train"):
    if mode == "train":
        batchsize = cfg.ims_per_gpu
        shuffle = True
        drop_last = True
    elif mode == "val":
        batchsize = cfg.eval_ims_per_gpu
        shuffle = False
        drop_last = False
    ds = Scenes(cfg.root, mode)
    if dist.is_initialized():
        if mode == "train":
            n_imgs = cfg.ims_per_gpu * dist.get_world_size() * cfg.max_iter
            sampler = RepeatedSampler(ds, n_imgs, shuffle=shuffle)
        else:
            sampler = DistributedSampler(ds, shuffle=shuffle)
        batchsampler = BatchSampler(sampler, batchsize, drop_last=drop_last)
        dl = DataLoader(ds, batch_sampler=batchsampler, num_workers=4, pin_memory=True)
    else:
        dl = DataLoader(
            ds,
            batch_size=batchsize,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=4,
            pin_memory=True,
        )
    return dl


def get_extra_loader(cfg, n_gpu):
    """Control: `n_gpu > 1` is DataParallel in Hugging Face scripts; under DDP every process
    has n_gpu == 1 and takes the `else`, which keeps GD201."""
    ds = Scenes(cfg.extra_root, "train")
    if n_gpu > 1:
        batch_size = 8 * n_gpu
    else:
        return DataLoader(ds, batch_size=8, num_workers=4, pin_memory=True)  # expect: GD201
    return DataLoader(ds, batch_size=batch_size, num_workers=4, pin_memory=True)  # expect: GD201


def get_aux_loader(cfg, world_size, mode="train"):
    """Controls: the distributed side of the test keeps GD201, and a sampler whose
    `shuffle` may be True on its branch keeps GD202 (no set_epoch in the job)."""
    shuffle = mode == "train"
    ds = Scenes(cfg.aux_root, mode)
    if world_size > 1:
        aux = DataLoader(ds, batch_size=8, num_workers=4, pin_memory=True)  # expect: GD201
    else:
        aux = DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, pin_memory=True)
    if mode == "train":
        shuffle = True
    sampler = DistributedSampler(ds, shuffle=shuffle)  # expect: GD202
    return aux, sampler
