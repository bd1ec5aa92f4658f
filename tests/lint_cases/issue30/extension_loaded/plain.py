import torch
import torch.nn as nn

device = torch.device("cuda:0")
net = nn.Linear(16, 16).to(device)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for _step in range(100):
    x = torch.randn(64, 16, device=device)
    loss = net(x).sum()
    optimizer.zero_grad()
    loss.backward()  # expect: GD601
    optimizer.step()
