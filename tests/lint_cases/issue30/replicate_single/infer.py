# Judge 20, M3 control: replicate in a single-process script (no DDP) is not GD102.
import torch
from torch import nn

model = nn.Linear(8, 8).cuda()
replicas = nn.parallel.replicate(model, list(range(torch.cuda.device_count())))
outputs = nn.parallel.parallel_apply(
    replicas, [torch.randn(4, 8).cuda(i) for i in range(len(replicas))]
)
