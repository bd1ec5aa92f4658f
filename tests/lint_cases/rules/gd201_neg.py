import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def main(model, dataset, val_set):
    dist.init_process_group("gloo")
    model = DDP(model)
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    val_loader = DataLoader(val_set, batch_size=32)  # evaluation on every rank is allowed
    model.val_loader = val_loader
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            model(batch).sum().backward()
    dist.destroy_process_group()
