"""GD102: a hand-written DataParallel run on every rank of a DDP job (twentieth judge, M3):
CLIP4Clip's `util.parallel_apply` calls `nn.parallel.replicate(model, device_ids)` over
`range(torch.cuda.device_count())` and runs one thread per replica; its evaluation calls
it on every rank."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext, is_const, keyword

_REPLICATE = "torch.nn.parallel.replicate"


def check(ctx: ModuleContext) -> Iterator[Hit]:
    calls = ctx.calls_to(_REPLICATE)
    if not calls or not any(module.ddp_code for module in ctx.component()):
        return
    for call in calls:
        devices = call.args[1] if len(call.args) > 1 else keyword(call, "devices")
        if _one_device(ctx, devices, call) or ctx.rank_guarded(call):
            continue
        yield Hit("GD102", call)


def _one_device(ctx: ModuleContext, devices: ast.expr | None, site: ast.AST) -> bool:
    """`[0]`, `[local_rank]`, or a local name bound only to a one-element list."""
    if isinstance(devices, ast.Name):
        values = ctx.assigned_values(devices.id, site)
        return bool(values) and all(_one_device(ctx, v, site) for v in values)
    return (
        isinstance(devices, (ast.List, ast.Tuple))
        and len(devices.elts) == 1
        and not is_const(devices.elts[0], None)
    )
