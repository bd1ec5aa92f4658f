"""GD101: nn.DataParallel (and the functional data_parallel)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import DATA_PARALLEL, ModuleContext


def check(ctx: ModuleContext) -> Iterator[Hit]:
    for call in ctx.calls_to(*DATA_PARALLEL):
        yield Hit("GD101", call)
