"""A callee copies to the host (`.detach().cpu()`) and returns the copy; the step reads it
with `.item()` / `.tolist()`: host memory, the sync is the callee's `.cpu()` (reported there,
once), not a second one at each read."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def gather_stats(logits, labels):
    correct = (logits.argmax(-1) == labels).float()
    return correct.mean().detach().cpu()  # expect: GD301


class Runner:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def collect(self, loss):
        stats = loss.detach().cpu()  # expect: GD301
        return stats

    def collect_many(self, loss, grad_norm):
        return {"loss": loss.detach().cpu(), "grad_norm": grad_norm.cpu()}  # expect: GD301

    def norms(self, grad_norm):
        return grad_norm.detach()

    def step(self, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        stats = self.collect(loss)
        acc = gather_stats(logits, y)
        many = self.collect_many(loss, grad_norm)
        kept = self.norms(grad_norm)
        logged = {
            "loss": stats.item(),
            "acc": acc.tolist(),
            "loss_copy": many["loss"].item(),
            "grad_norm": kept.item(),  # expect: GD301
        }
        return logged


def train(rank, model, loader, optimizer):
    dist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    runner = Runner(DDP(model.cuda(rank), device_ids=[rank]), optimizer)
    for epoch in range(10):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            runner.step(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
    dist.destroy_process_group()
