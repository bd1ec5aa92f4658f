import torch
import torch.nn as nn
from torch.nn import DataParallel as DP
from torch.nn.parallel import data_parallel

model = nn.Linear(8, 8).cuda()
a = nn.DataParallel(model)  # expect: GD101
b = DP(model, device_ids=[0, 1])  # expect: GD101
c = torch.nn.parallel.DataParallel(model)  # expect: GD101
out = data_parallel(model, torch.randn(4, 8).cuda())  # expect: GD101


class Trainer:
    def __init__(self, net):
        self.net = torch.nn.DataParallel(net)  # expect: GD101
