import torch
import torch.distributed as dist

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend=backend)  # chosen at run time: fine
dist.init_process_group(backend="cpu:gloo,cuda:nccl")
dist.destroy_process_group()
