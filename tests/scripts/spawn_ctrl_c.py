"""mp.spawn DDP on 2 ranks that trains until interrupted; each worker saves ckpt.<rank>
when Ctrl-C reaches it (a terminal sends SIGINT to every process of its foreground
group). Traced by tests/test_spawn_signals.py. Usage: spawn_ctrl_c.py PORT"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def work(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    started = False
    try:
        while True:
            opt.zero_grad()
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
            if not started:
                started = True
                open(f"started.{rank}", "w").close()
            time.sleep(0.05)
    except KeyboardInterrupt:
        torch.save(net.state_dict(), f"ckpt.{rank}")
        print(f"rank {rank} saved", flush=True)


if __name__ == "__main__":
    try:
        mp.spawn(work, args=(2, int(sys.argv[1])), nprocs=2)
    except KeyboardInterrupt:
        sys.exit(130)
