import torch
import torch.distributed as dist

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend=backend)  # chosen at run time: fine
dist.init_process_group(backend="cpu:gloo,cuda:nccl")
dist.destroy_process_group()

if torch.cuda.is_available():
    dist.init_process_group("nccl")
else:
    dist.init_process_group("gloo")  # the CPU fallback branch
dist.destroy_process_group()
