"""Loaders over data already in memory (GD203: nothing for workers to take off the main
process): a list of pre-tokenised examples handed to a loader factory as a parameter, and
PyTorch Geometric datasets that hold their graphs (`get(idx)` indexes a list; an
`InMemoryDataset`). Pinning still concerns the host-to-device copy, so GD204 stays. A
dataset whose `get` reads a file from disk is still reported (the control)."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch_geometric.data import Dataset, InMemoryDataset
from torch_geometric.loader import DataLoader as GraphLoader


def collate(examples):
    ids = torch.nn.utils.rnn.pad_sequence([e["input_ids"] for e in examples], batch_first=True)
    return ids, torch.tensor([e["label"] for e in examples])


def make_loader(examples, batch_size, sampler):
    return DataLoader(  # expect: GD204
        examples, batch_size=batch_size, sampler=sampler, collate_fn=collate
    )


def make_shard_loader(examples: list[dict], batch_size, sampler):
    return DataLoader(  # expect: GD204
        examples, batch_size=batch_size, sampler=sampler, collate_fn=collate
    )


def endless_batches(examples: list[dict], bs, sampler):
    it = iter(DataLoader(examples, batch_size=bs, sampler=sampler))  # expect: GD204
    while True:
        yield next(it)


class MoleculeGraphs(Dataset):
    def __init__(self, graphs):
        super().__init__(None)
        self.graphs = graphs

    def len(self):
        return len(self.graphs)

    def get(self, idx):
        return self.graphs[idx]


class QM9Subset(InMemoryDataset):
    def __init__(self, root):
        super().__init__(root)
        self.load(self.processed_paths[0])


class OnDiskGraphs(Dataset):
    def len(self):
        return len(os.listdir(self.processed_dir))

    def get(self, idx):
        return torch.load(os.path.join(self.processed_dir, f"data_{idx}.pt"))


def main(tokenizer, texts, labels, graphs, model, optimizer):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    examples = [
        {"input_ids": torch.tensor(tokenizer(t)), "label": y}
        for t, y in zip(texts, labels, strict=True)
    ]
    sampler = torch.utils.data.DistributedSampler(examples)
    train_loader = make_loader(examples, 32, sampler)
    shard_loader = make_shard_loader(examples[:100], 64, sampler)
    sampler_g = torch.utils.data.DistributedSampler(graphs)
    graph_loader = GraphLoader(  # expect: GD204
        MoleculeGraphs(graphs), batch_size=16, sampler=sampler_g
    )
    qm9 = QM9Subset("data/qm9")
    qm9_loader = GraphLoader(
        qm9, batch_size=16, sampler=torch.utils.data.DistributedSampler(qm9), pin_memory=True
    )
    disk = OnDiskGraphs("data/big")
    disk_loader = GraphLoader(  # expect: GD203
        disk, batch_size=16, sampler=torch.utils.data.DistributedSampler(disk), pin_memory=True
    )
    probe = next(endless_batches(examples[:8], 8, sampler))
    for epoch in range(10):
        for s in (sampler, sampler_g):
            s.set_epoch(epoch)
        for ids, y in train_loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids.cuda(), y.cuda())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()
    return probe, shard_loader, graph_loader, qm9_loader, disk_loader
