"""Eighteenth judge, F3 (NBFNet-PyG): a DataLoader over a tensor built from a graph the
caller moved to the GPU: workers cannot use CUDA tensors and pinning raises, so neither
GD203 nor GD204. A loader over the same tensor built from the host graph is reported (the
control)."""

import torch
from torch.utils import data as torch_data


def train(model, train_data, batch_size):
    triplets = torch.cat([train_data.edge_index, train_data.edge_type.unsqueeze(0)]).t()
    loader = torch_data.DataLoader(triplets, batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch.float()).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def host_loader(host_data, batch_size):
    triplets = torch.cat([host_data.edge_index, host_data.edge_type.unsqueeze(0)]).t()
    return torch_data.DataLoader(triplets, batch_size)  # expect: GD203 GD204


class Graph:
    def __init__(self):
        self.edge_index = torch.randint(0, 10, (2, 100))
        self.edge_type = torch.randint(0, 3, (100,))

    def to(self, device):
        self.edge_index = self.edge_index.to(device)
        self.edge_type = self.edge_type.to(device)
        return self


def main():
    device = torch.device("cuda:0")
    graph = Graph()
    host_loader(graph, 32)
    graph = graph.to(device)
    train(torch.nn.Linear(3, 1).to(device), graph, 32)


if __name__ == "__main__":
    main()
