import torch

model = torch.nn.parallel.DistributedDataParallel(  # expect: GD401
    torch.nn.Linear(4, 4), find_unused_parameters=True
)
