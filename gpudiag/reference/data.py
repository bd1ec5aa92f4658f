"""Synthetic but learnable data: targets come from a fixed random teacher network.

Served by a real Dataset and DataLoader. Every mode uses a DistributedSampler (one
replica outside DDP) with the same seed, so step k of an N-rank DDP run sees exactly the
samples of step k of a single-device run whose batch is N times larger: the sampler
deals the same permutation out round-robin, and the union of the N ranks' k-th batches
is the k-th contiguous block of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import default_collate

from gpudiag.reference.models import Workload

_TEACHER_SEED_OFFSET = 1_000_003
_TEACHER_HIDDEN = 32
_SPLIT_SEED_OFFSET = {"train": 0, "eval": 7_919}


class TeacherDataset(Dataset):
    """``n`` inputs drawn from N(0, 1) and targets ``teacher(x)``; the "train" and "eval"
    splits share the teacher and differ in inputs.

    The teacher is a random two-layer tanh network of the (sequence-mean of the) input,
    fixed by the seed, so the task is learnable by every workload.
    """

    def __init__(self, workload: Workload, n: int, seed: int, split: str = "train") -> None:
        teacher_gen = torch.Generator().manual_seed(seed + _TEACHER_SEED_OFFSET)
        features = workload.input_shape[-1]
        w1 = torch.randn(features, _TEACHER_HIDDEN, generator=teacher_gen) / features**0.5
        w2 = torch.randn(_TEACHER_HIDDEN, workload.out_dim, generator=teacher_gen)
        w2 /= _TEACHER_HIDDEN**0.5
        input_gen = torch.Generator().manual_seed(seed + _SPLIT_SEED_OFFSET[split])
        self.inputs = torch.randn((n, *workload.input_shape), generator=input_gen)
        pooled = self.inputs if self.inputs.dim() == 2 else self.inputs.mean(dim=1)
        self.targets = torch.tanh(pooled @ w1) @ w2

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class SlowCollate:
    """Collate that sleeps a fixed time per batch: a DataLoader-bound input pipeline.
    A class, not a closure, so DataLoader workers can pickle it."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> object:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return default_collate(list(batch))


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int = 0,
    slow_data_s: float = 0.0,
    pin_memory: bool = False,
) -> tuple[DataLoader, DistributedSampler]:
    """A loader of full batches of ``batch_size`` (per rank) and its sampler; call
    ``sampler.set_epoch(epoch)`` before each epoch."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        collate_fn=SlowCollate(slow_data_s),
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
    return loader, sampler
