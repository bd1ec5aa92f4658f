# Judge 20, D2 variant: the kernels are wrapped in a package the linted file does not show,
# but csrc/setup.py next to it builds a CUDAExtension (votenet's pointnet2/setup.py).
import torch
import torch.nn as nn
from pointnet2_modules import PointnetSAModule

device = torch.device("cuda:0")
net = nn.Sequential(PointnetSAModule(), nn.Linear(64, 10)).to(device)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for _step in range(100):
    x = torch.randn(8, 1024, 3, device=device)
    loss = net(x).sum()
    optimizer.zero_grad()
    loss.backward()  # expect: GD601
    optimizer.step()
