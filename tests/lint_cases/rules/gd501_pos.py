import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")  # expect: GD501
tensor = torch.ones(4, device="cuda")
dist.all_reduce(tensor)
dist.destroy_process_group()
