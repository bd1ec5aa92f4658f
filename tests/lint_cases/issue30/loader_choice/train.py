"""The loader class chosen by a conditional expression (`Loader = DataLoader if ... else
...`) is a DataLoader: its calls are checked like `DataLoader(...)` (GD203 / GD204 here,
the batches it yields are per-step code)."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torch_geometric.loader import DataLoader as GraphLoader


class PrefetchLoader:
    def __init__(self, dataset, **kwargs):
        self.dataset = dataset


def build(args, dataset):
    Loader = DataLoader if not args.prefetch else PrefetchLoader
    sampler = DistributedSampler(dataset)
    bs = args.batch_size
    train_loader = Loader(dataset, batch_size=bs, sampler=sampler)  # expect: GD203 GD204
    return train_loader, sampler


Loader2 = GraphLoader if torch.cuda.is_available() else DataLoader


def build_graphs(dataset):
    sampler = DistributedSampler(dataset)
    return Loader2(dataset, batch_size=8, sampler=sampler, num_workers=4), sampler  # expect: GD204


def train(args, dataset, graphs, model, optimizer):
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    train_loader, sampler = build(args, dataset)
    graph_loader, graph_sampler = build_graphs(graphs)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        graph_sampler.set_epoch(epoch)
        for x, y in train_loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()
    return graph_loader
