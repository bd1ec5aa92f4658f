"""torch.compile(fullgraph=True) of a function that calls a module, and torch.export
(strict) before training (issue 28 probe 28f): gpudiag's forward hook broke the graph."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
exported = torch.export.export(model, (torch.randn(3, 4),), strict=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


@torch.compile(fullgraph=True, backend="eager")
def loss_of(x):
    return model(x).relu().sum()


for _ in range(6):
    opt.zero_grad()
    loss = loss_of(torch.randn(8, 4))
    loss.backward()
    opt.step()
print("COMPILED_DONE", len(list(exported.graph.nodes)) > 0)
