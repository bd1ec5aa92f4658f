"""The reference workloads: the same three models in every training mode.

Dropout is off everywhere so that DDP on N ranks and single-device training on the same
global batch end with the same parameters (the correctness test depends on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Workload:
    """A model and the shape of the samples it eats."""

    name: str
    input_shape: tuple[int, ...]
    out_dim: int
    build: Callable[[], nn.Module]
    description: str
    default_lr: float = 0.05


def toy_model() -> nn.Module:
    """The source article's model: Linear(10, 20) -> ReLU -> Linear(20, 5)."""
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


def heavy_mlp(in_dim: int = 64, width: int = 512, depth: int = 4, out_dim: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class TinyTransformer(nn.Module):
    """Encoder over a sequence of feature vectors, mean-pooled, then a linear head."""

    def __init__(
        self, d_model: int = 64, nhead: int = 4, num_layers: int = 2, out_dim: int = 10
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


WORKLOADS: dict[str, Workload] = {
    "toy": Workload("toy", (10,), 5, toy_model, "the article's Linear(10,20)-ReLU-Linear(20,5)"),
    "mlp": Workload("mlp", (64,), 10, heavy_mlp, "compute-heavier MLP, 4 x 512 wide", 0.3),
    "transformer": Workload(
        "transformer", (16, 64), 10, TinyTransformer, "2-layer transformer encoder, d=64, seq 16"
    ),
}


class ReferenceModel(nn.Module):
    """Wraps a workload so a chosen rank can be made slow *inside* forward, where a real
    straggler's extra compute would be (the wrapper exists on every rank so parameter
    names match across ranks and modes)."""

    def __init__(self, net: nn.Module, slow_forward_s: float = 0.0) -> None:
        super().__init__()
        self.net = net
        self.slow_forward_s = slow_forward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_forward_s > 0:
            time.sleep(self.slow_forward_s)
        return self.net(x)


def build_model(name: str, seed: int, slow_forward_s: float = 0.0) -> ReferenceModel:
    """The same initial weights on every rank: the seed is set right before building."""
    torch.manual_seed(seed)
    return ReferenceModel(WORKLOADS[name].build(), slow_forward_s)
