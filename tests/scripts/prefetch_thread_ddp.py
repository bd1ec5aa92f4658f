"""DDP whose batches come from a prefetch thread (BackgroundGenerator style): the thread
iterates the DataLoader, so it takes the first batch before the training thread's first
forward, and it ends before the run does. Under gpudiag it crashed with SIGSEGV in 3 of
3 runs (issue 28 probe): the profiler was started in that thread and exported from the
main one after the thread had ended."""

import queue
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Prefetch(threading.Thread):
    def __init__(self, batches):
        super().__init__(daemon=True)
        self.queue = queue.Queue(4)
        self.batches = batches
        self.start()

    def run(self):
        for batch in self.batches:
            self.queue.put([t.float() * 1.0 for t in batch])
        self.queue.put(None)

    def __iter__(self):
        while (batch := self.queue.get()) is not None:
            yield batch


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randn(1024, 1))
    for x, y in Prefetch(torch.utils.data.DataLoader(data, batch_size=32)):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
