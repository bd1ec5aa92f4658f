# Judge 20, M3: a hand-written DataParallel (nn.parallel.replicate + one thread per GPU)
# run by every DDP rank over all visible GPUs (CLIP4Clip's util.parallel_apply): GD102, low.
import os
import threading

import torch
import torch.distributed as dist
from torch import nn


def parallel_apply(fct, model, inputs, device_ids):
    modules = nn.parallel.replicate(model, device_ids)  # expect: GD102
    results = {}

    def _worker(i, module, inp):
        with torch.cuda.device(device_ids[i]):
            results[i] = fct(module, *inp)

    threads = [
        threading.Thread(target=_worker, args=(i, m, x))
        for i, (m, x) in enumerate(zip(modules, inputs, strict=False))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(inputs))]


def one_gpu(model, x, local_rank):
    (replica,) = nn.parallel.replicate(model, [local_rank])  # one device: no replication cost
    return replica(x)


def score(module, text, video):
    return module(text, video)


local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = nn.Bilinear(8, 8, 1).cuda()
n_gpu = torch.cuda.device_count()
inputs = [
    (torch.randn(4, 8, device=f"cuda:{i}"), torch.randn(4, 8, device=f"cuda:{i}"))
    for i in range(n_gpu)
]
with torch.no_grad():
    sims = parallel_apply(score, model, inputs, list(range(n_gpu)))
    one_gpu(model, torch.randn(4, 8).cuda(), local_rank)
dist.destroy_process_group()
