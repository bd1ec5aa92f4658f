"""modded-nanogpt: counts made with torch.from_numpy travel through a returned tuple and
an attribute to a helper that reads them with .item() / .tolist(): host memory, no sync."""

import numpy as np
import torch
import torch.distributed as dist


def start(idxes_np, world):
    points = np.searchsorted(idxes_np, np.arange(world + 1))
    send_counts = torch.from_numpy(points[1:] - points[:-1])
    recv_counts = torch.empty_like(send_counts)
    on_gpu = torch.empty_like(send_counts, device="cuda")
    return send_counts, recv_counts, on_gpu


def share(send_counts, recv_counts, on_gpu):
    total = recv_counts.sum().item()
    recv = recv_counts.tolist()
    send = send_counts.tolist()
    waits = on_gpu.tolist()  # expect: GD301
    return total, recv, send, waits


class Sparse:
    def update(self, idxes_np, world):
        send_counts, recv_counts, on_gpu = start(idxes_np, world)
        self.state = (send_counts, recv_counts, on_gpu)

    def share(self):
        send_counts, recv_counts, on_gpu = self.state
        return share(send_counts, recv_counts, on_gpu)


def train(model, loader, optimizer):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[0])
    sparse = Sparse()
    history = []
    for x in loader:
        with torch.autocast("cuda"):
            loss = model(x.cuda(non_blocking=True)).mean()
        loss.backward()
        sparse.update(np.flatnonzero(x.numpy()), 8)
        sparse.share()
        optimizer.step()
        steps = torch.tensor([1, 2])
        history.append(steps.sum().item())
        history.append(loss.detach().sum().item())  # expect: GD301
    dist.destroy_process_group()
