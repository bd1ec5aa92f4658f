"""Rank 1 all-reduces 5 floats where rank 0 reduces 4, at call 15, without DDP: run
with TORCH_DISTRIBUTED_DEBUG=DETAIL, torch checks each call's fingerprint first and both
ranks raise a RuntimeError (with DDP in this mode torch 2.13 CPU segfaults, gpudiag or
not)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for call in range(30):
    size = 5 if rank == 1 and call == 14 else 4
    dist.all_reduce(torch.ones(size))  # MISMATCH HERE
dist.destroy_process_group()
