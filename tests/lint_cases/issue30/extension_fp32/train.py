# Judge 20, D2: fp32 training whose hot path is a custom CUDA extension (pointnet2-style
# grouping kernels taking float* only): GD601 stays (the convolutions still gain), and its
# message and fix name torch.amp.custom_fwd(cast_inputs=torch.float32) for the Function.
import pointnet2_ext as _ext  # compiled kernels (ops/setup.py)
import torch
import torch.nn as nn
from torch.autograd import Function
from torch.utils.data import DataLoader


class GroupingOperation(Function):
    @staticmethod
    def forward(ctx, features, idx):
        ctx.save_for_backward(idx)
        return _ext.group_points_wrapper(features, idx)

    @staticmethod
    def backward(ctx, grad_out):
        (idx,) = ctx.saved_tensors
        return _ext.group_points_grad_wrapper(grad_out, idx), None


class SAModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Conv1d(3, 64, 1)

    def forward(self, xyz, idx):
        return GroupingOperation.apply(self.mlp(xyz.transpose(1, 2)), idx).max(-1)[0]


device = torch.device("cuda:0")
data = torch.load("points.pt")
loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=4, pin_memory=True)
net = SAModule().to(device)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
for _epoch in range(10):
    for xyz, idx, target in loader:
        xyz = xyz.to(device, non_blocking=True)
        idx = idx.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        loss = (net(xyz, idx) - target).abs().mean()
        optimizer.zero_grad()
        loss.backward()  # expect: GD601
        optimizer.step()
