# Judge 22, FP5 (DiffDock's confidence/dataset.py): a dataset's preparation method runs the
# model once over the cached complexes to build its labels: no training step to stall.
from torch.utils.data import DataLoader, Dataset


class ConfidenceSet(Dataset):
    def __init__(self, graphs, model, device):
        self.graphs = graphs
        self.labels = self.preprocessing(model, device)

    def preprocessing(self, model, device):
        loader = DataLoader(self.graphs, batch_size=1, shuffle=False)
        labels = []
        for graph in loader:
            labels.append(model(graph.to(device)).detach().float().mean())
        return labels

    def __getitem__(self, index):
        return self.graphs[index], self.labels[index]

    def __len__(self):
        return len(self.graphs)
