# Judge 20, M1: a DataLoader built through a parameter whose default is the class
# (denoiser's distrib.loader), its options forwarded through **kwargs from the callers.
import os

import torch
import torch.distributed as dist
from audio_data import Audio  # reads and decodes files
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler


def loader(dataset, *args, shuffle=False, klass=DataLoader, **kwargs):
    if dist.get_world_size() == 1:
        return klass(dataset, *args, shuffle=shuffle, **kwargs)  # expect: GD204
    if shuffle:
        sampler = DistributedSampler(dataset)
        return klass(dataset, *args, **kwargs, sampler=sampler)  # expect: GD204
    dataset = Subset(dataset, list(range(dist.get_rank(), len(dataset), dist.get_world_size())))
    return klass(
        dataset, *args, shuffle=shuffle
    )  # evaluation only (cv_loader): no GD203, judge 21 D3


def pinned(dataset, factory=DataLoader, **options):
    return factory(dataset, **options)


def main():
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    tr_loader = loader(Audio("train"), batch_size=64, shuffle=True, num_workers=5)
    cv_loader = loader(Audio("valid"), batch_size=1, num_workers=5)
    extra = pinned(Audio("extra"), batch_size=8, num_workers=4, pin_memory=True)
    model = DistributedDataParallel(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    for epoch in range(100):
        tr_loader.sampler.set_epoch(epoch)
        for noisy, clean in tr_loader:
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                estimate = model(noisy.cuda())
            torch.nn.functional.l1_loss(estimate.float(), clean.cuda()).backward()
            optimizer.step()
        for _batch in extra:
            pass
        with torch.no_grad():
            for noisy, _clean in cv_loader:
                model(noisy.cuda())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
