from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# CPU (gloo) training: device_ids must stay None
model = DDP(nn.Linear(4, 4))
