"""2-rank gloo DDP job whose rank 0 does side work between steps while rank 1 waits in
dist.barrier() (tests/test_paths_watch_children.py). Run under `gpudiag trace
--nproc-per-node 2 subwork_job.py MODE [SECONDS] [ARG...]`:

  child       rank 0 runs a CPU-busy Python subprocess (subprocess.run) for SECONDS
  grandchild  the same through `sh -c` (the busy process is rank 0's grandchild)
  sleep       rank 0 sleeps SECONDS in time.sleep (Python, no CPU)

Extra arguments are ignored (the non-UTF-8 argument test passes one). No gpudiag code.
"""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def main() -> None:
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(n: int) -> None:
        for _ in range(n):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

    steps(6)
    if rank == 0 and mode != "none":
        t0 = time.time()
        if mode == "child":
            subprocess.run([sys.executable, "-c", BUSY.format(s=seconds)], check=True)
        elif mode == "grandchild":
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_busy.py")
            subprocess.run(
                ["sh", "-c", f'"{sys.executable}" "{script}" {seconds}; true'], check=True
            )
        elif mode == "sleep":
            time.sleep(seconds)
        print(f"rank 0 side work took {time.time() - t0:.1f} s", flush=True)
    dist.barrier()
    steps(4)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
