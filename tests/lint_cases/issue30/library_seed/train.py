# Judge 21, F3: a seeding helper of another package seeds torch before DDP (icefall's
# lhotse `fix_random_seed(params.seed)` in the spawned worker): no GD405.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lhotse.utils import fix_random_seed
from torch.nn.parallel import DistributedDataParallel as DDP


def run(rank, world_size):
    fix_random_seed(42)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(10, 10).cuda(rank), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 10, device=rank)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
