"""gloo job where one rank (1, or `--culprit R`) stops calling collectives at step 3 (it
sleeps), so the other ranks hang in all_reduce; with --desync it all-reduces a different
size instead. Run under `gpudiag trace --nproc-per-node 2 --hang-timeout S`."""

import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    desync = "--desync" in sys.argv
    culprit = int(sys.argv[sys.argv.index("--culprit") + 1]) if "--culprit" in sys.argv else 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        size = 64
        if rank == culprit and step == 3:
            if not desync:
                time.sleep(600)  # the culprit never reaches the all_reduce below
            size = 128
        dist.all_reduce(torch.ones(size))
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
