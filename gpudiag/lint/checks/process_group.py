"""GD501-GD503: process-group backend and lifetime."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext, keyword

_INIT = "torch.distributed.init_process_group"
_DESTROY = "torch.distributed.destroy_process_group"


def check(ctx: ModuleContext) -> Iterator[Hit]:
    inits = ctx.calls_to(_INIT)
    for init in inits:
        backend = _literal_backend(init)
        if ctx.device_conditional(init):  # `if torch.cuda.is_available(): nccl else: gloo`
            continue
        if backend == "gloo" and ctx.gpu_job:
            yield Hit("GD501", init)
        elif backend == "nccl" and not ctx.component_gpu_job():
            yield Hit("GD502", init)
    if inits and not ctx.component_calls_to(_DESTROY):
        yield Hit("GD503", inits[0])


def _literal_backend(init: ast.Call) -> str | None:
    backend = keyword(init, "backend") or (init.args[0] if init.args else None)
    if isinstance(backend, ast.Constant) and isinstance(backend.value, str):
        return backend.value.lower()
    return None
