import torch

a = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), find_unused_parameters=False)
b = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), static_graph=True)
