import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def main(model, dataset):
    dist.init_process_group("gloo")
    model = DDP(model)
    train_loader = DataLoader(dataset, batch_size=32, shuffle=True)  # expect: GD201
    for batch in train_loader:
        model(batch).sum().backward()
    dist.destroy_process_group()
