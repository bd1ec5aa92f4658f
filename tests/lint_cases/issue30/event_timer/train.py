# msn's gpu_timer (judge 19, F4): the synchronize of a CUDA-event timer on by default is a
# per-step stall; the fix is a timing one (every N steps, elapsed_time later, profiler).
import os

import torch
import torch.nn as nn


def gpu_timer(closure, log_timings=True):
    elapsed_time = -1.0
    if log_timings:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
    result = closure()
    if log_timings:
        end.record()
        torch.cuda.synchronize()  # expect: GD301
        elapsed_time = start.elapsed_time(end)
    return result, elapsed_time


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(1000):
        x = torch.randn(4, 8, device="cuda")

        def train_step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().mean()  # noqa: B023
            opt.zero_grad()
            loss.backward()
            opt.step()

        _, ms = gpu_timer(train_step)
        torch.cuda.synchronize()  # expect: GD301
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
