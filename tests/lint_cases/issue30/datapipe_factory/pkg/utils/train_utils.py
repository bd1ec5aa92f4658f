import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from pkg.data.pipes import Dataset


def init_loaders(files, model):
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    torch.manual_seed(0)
    model = DDP(model.cuda(), device_ids=[dist.get_rank()])
    # the factory's datapipe shards itself: no sampler to add (was GD201)
    train = DataLoader(Dataset(files), batch_size=16, num_workers=4, pin_memory=True)
    # a map-style dataset without a sampler: every rank reads all of it
    extra = DataLoader(  # expect: GD201
        TensorDataset(torch.load("x.pt")), batch_size=16, num_workers=4, pin_memory=True
    )
    return model, train, extra


def finish():
    dist.destroy_process_group()
