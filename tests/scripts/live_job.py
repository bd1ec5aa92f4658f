"""2-rank gloo job for the `gpudiag watch` tests. Run under
`gpudiag trace --nproc-per-node 2 live_job.py MODE STOP_FILE [MAX_STEPS]`:

  slow   rank 1 sleeps 40 ms before its all-reduces every step (it lags)
  stuck  rank 1 stops calling collectives at step 5 (sleeps), rank 0 waits in all_reduce
  fail   rank 1 raises at step 3
  ddp    DDP model; rank 1 stops at step 5 (sleeps before forward), rank 0 waits in
         DDP's C++ bucket all-reduce (no Python call the recorder wraps)
  ddpslow  DDP model of 8 layers, one bucket per parameter (16 C++ all-reduces a step, no
         Python collective: only the Flight Recorder sees them); rank 1 sleeps 30 ms
         before backward every step; MAX_STEPS steps, no stop file (its all-reduce would
         be a Python call)

Both ranks stop together at the step after STOP_FILE appears (or after MAX_STEPS,
default 3000). An optional 4th argument names the rank that is slow / stuck / fails
instead of rank 1 (a multi-node job's rank on node 1).
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    mode, stop_file = sys.argv[1], sys.argv[2]
    max_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    target = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(64, 64)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    if mode == "ddpslow":
        from torch.nn.parallel import DistributedDataParallel

        layers = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8)))
        model = DistributedDataParallel(layers, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    if mode == "ddpslow":
        for _ in range(max_steps):
            out = model(x).sum()
            if rank == target:
                time.sleep(0.03)
            opt.zero_grad()
            out.backward()
            opt.step()
        dist.destroy_process_group()
        return
    for step in range(max_steps):
        stop = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        if rank == target and mode == "ddp" and step == 5:
            time.sleep(600)
        opt.zero_grad()
        model(x).sum().backward()
        if rank == target and mode == "slow":
            time.sleep(0.04)
        if rank == target and mode == "stuck" and step == 5:
            time.sleep(600)
        if rank == target and mode == "fail" and step == 3:
            raise RuntimeError("live test: rank 1 fails at step 3")
        for p in model.parameters() if mode != "ddp" else ():
            dist.all_reduce(p.grad)
        opt.step()
        time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
