"""2-rank gloo job where rank 1 stops calling collectives at step 3 (it sleeps), so
rank 0 hangs in all_reduce; with --desync rank 1 all-reduces a different size instead.
Run under `gpudiag trace --nproc-per-node 2 --hang-timeout S`."""

import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    desync = "--desync" in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        size = 64
        if rank == 1 and step == 3:
            if not desync:
                time.sleep(600)  # rank 1 never reaches the all_reduce below
            size = 128
        dist.all_reduce(torch.ones(size))
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
