"""Small DDP MLP on gloo for gpudiag's capture tests and bench/overhead.py.

Runs under torchrun (or `gpudiag trace --nproc-per-node N`). Options:
  --steps N            training steps (default 12)
  --crash-rank R --crash-step S   rank R raises RuntimeError at step S
  --hang-rank R --hang-step S     rank R sleeps for an hour at step S (others block in DDP)
  --sleep S            seconds to sleep in every step (lets a test signal the job mid-run)
  --times FILE         append this rank's per-step wall times (ms) as one JSON line
  --width W --depth D  MLP size
  --thread-cpu N       with --times: CPU time (schedstat, ns) and context switches of every
                       thread of this rank, and on rank 0 of its parent processes up to the
                       pid in $OVERHEAD_BENCH_PID (launcher, agent), at step N and at the
                       end (bench/overhead.py charges each thread's CPU per step)
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--times", default=None)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--thread-cpu", type=int, default=-1)
    return p.parse_args()


def _task_cpu(pid: int) -> list[list]:
    """[pid, tid, comm, cpu ns, context switches] of every thread of one process."""
    rows = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as fh:
                comm = fh.read().strip()
            with open(f"{base}/schedstat") as fh:
                cpu_ns = int(fh.read().split()[0])
            with open(f"{base}/status") as fh:
                switches = sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue
        rows.append([pid, int(tid), comm, cpu_ns, switches])
    return rows


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return ""


def thread_cpu(rank: int) -> dict:
    """This rank's threads, and on rank 0 its ancestors' up to the bench process."""
    pids = [os.getpid()]
    stop = int(os.environ.get("OVERHEAD_BENCH_PID", "0") or 0)
    pid = os.getppid()
    while rank == 0 and stop and pid not in (0, 1, stop) and len(pids) < 5:
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return {
        "t": time.monotonic(),
        "procs": {str(p): _cmdline(p) for p in pids},
        "tasks": [row for p in pids for row in _task_cpu(p)],
    }


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data))
    times = []
    cpu_times = []  # process CPU time per step: far less disturbed by other load than wall
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    threads = []
    for step, (x, y) in enumerate(loader):
        if step == args.thread_cpu:
            threads.append(thread_cpu(rank))
        t0 = time.perf_counter()
        c0 = time.process_time()
        if rank == args.crash_rank and step == args.crash_step:
            raise RuntimeError(f"injected crash on rank {rank} at step {step}")
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(3600)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu_times.append((time.process_time() - c0) * 1e3)
    if threads:
        threads.append(thread_cpu(rank))
    if args.times:
        with open(args.times, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "rank": rank,
                        "pid": os.getpid(),
                        "grad_bytes": grad_bytes,
                        "steps": len(times),
                        "ms": times,
                        "cpu_ms": cpu_times,
                        "threads": threads,
                    }
                )
                + "\n"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
