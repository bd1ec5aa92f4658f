"""What a traced rank carries of gpudiag's while the script runs (issue 28, N4): its
threads (Python's and the kernel's names), each gpudiag thread's stack mapping, VmSize
and the open fds. Prints one JSON line, ``OWN_THREADS {...}``."""

import json
import os
import threading

import torch


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for _ in range(6):
    sgd.zero_grad()
    net(torch.randn(16, 64)).sum().backward()
    sgd.step()


def stack_mapping_kib(tid: int) -> int | None:
    """Size of the mapping that holds the thread's stack pointer (it is blocked in a
    system call: /proc/<tid>/syscall gives the pointer)."""
    try:
        fields = read(f"/proc/self/task/{tid}/syscall").split()
        sp = int(fields[-2], 16)
    except (OSError, ValueError, IndexError):
        return None
    for line in read("/proc/self/maps").splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= sp < hi:
            return (hi - lo) // 1024
    return None


kernel = {}
for tid in os.listdir("/proc/self/task"):
    try:
        kernel[int(tid)] = read(f"/proc/self/task/{tid}/comm").strip()
    except OSError:
        pass
ours = {tid: name for tid, name in kernel.items() if name.startswith("gpudiag")}
status = dict(line.split(":", 1) for line in read("/proc/self/status").splitlines())
print(
    "OWN_THREADS "
    + json.dumps(
        {
            "python": [t.name for t in threading.enumerate()],
            "kernel_gpudiag": sorted(ours.values()),
            "stacks_kib": [stack_mapping_kib(tid) for tid in ours],
            "vmsize_kib": int(status["VmSize"].split()[0]),
            "fds": len(os.listdir("/proc/self/fd")),
        }
    ),
    flush=True,
)
