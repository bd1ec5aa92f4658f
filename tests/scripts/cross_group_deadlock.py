"""3 ranks: rank 1 makes one more all_reduce in the group of ranks 1 and 2 than rank 2,
which goes on to the global barrier: rank 1 waits for rank 2 in group 1, rank 2 (and
rank 0) wait for rank 1 in the barrier, a deadlock across process groups."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
pair = dist.new_group([1, 2])
x = torch.ones(4)
dist.all_reduce(x)
if rank in (1, 2):
    dist.all_reduce(x, group=pair)
if rank == 1:
    dist.all_reduce(x, group=pair)  # ONE MORE HERE
dist.barrier()  # BARRIER HERE
dist.destroy_process_group()
