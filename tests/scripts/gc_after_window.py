"""A 2-rank gloo DDP loop that notes each full (generation 2) garbage collection python
runs with the step it ran in, to ``gc_rank<N>.json`` beside the script: the export of
gpudiag's profiled window must not leave the collector a full pass owed to a later step
(probe 31n, D1)."""

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

full_passes: list[int] = []
step = -1


def note(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:
        full_passes.append(step)


gc.callbacks.append(note)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(
    torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[1])
data = torch.utils.data.TensorDataset(
    torch.randn(64 * steps, 256), torch.randint(0, 10, (64 * steps,))
)
for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=64)):  # noqa: B007 - note() reads it
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
gc.callbacks.remove(note)
Path(__file__).with_name(f"gc_rank{rank}.json").write_text(json.dumps(full_passes))
dist.destroy_process_group()
