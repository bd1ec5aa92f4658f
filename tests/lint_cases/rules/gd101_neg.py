from torch import nn
from torch.nn.parallel import DistributedDataParallel


class DataParallel(nn.Module):  # a user's own class of the same name is not torch's
    pass


model = DataParallel()
wrapped = DistributedDataParallel(model)
text = "nn.DataParallel(model)"  # strings and comments: nn.DataParallel(model)
