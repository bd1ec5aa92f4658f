# Judge 20, D2 variants: an extension compiled with torch.utils.cpp_extension.load, and a
# setup.py next to the script building a CUDAExtension: GD601 names custom_fwd. The
# control script (plain.py) has no extension: the rule's own message and fix.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

knn = load(name="knn", sources=["knn.cpp", "knn_cuda.cu"])
device = torch.device("cuda:0")
net = nn.Linear(16, 16).to(device)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for _step in range(100):
    x = torch.randn(64, 16, device=device)
    loss = knn.forward(net(x)).sum()
    optimizer.zero_grad()
    loss.backward()  # expect: GD601
    optimizer.step()
