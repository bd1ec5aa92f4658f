"""GD401-GD405: how DistributedDataParallel is constructed."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import DDP, ModuleContext, is_const, keyword

_MOVES = ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "to_empty")
_MODIFIES = ("add_module", "register_module", "register_parameter", "register_buffer", "apply")
_SET_DEVICE = (
    "torch.cuda.set_device",
    "torch.cuda.device",
    "torch.accelerator.set_device_index",
    "torch.accelerator.set_device_idx",
)
_SEEDS = ("manual_seed", "set_seed", "seed_everything", "seed_all")


def check(ctx: ModuleContext) -> Iterator[Hit]:
    ddp_calls = ctx.calls_to(DDP)
    for ddp in ddp_calls:
        if is_const(keyword(ddp, "find_unused_parameters"), True):
            yield Hit("GD401", ddp)
        yield from _changed_after_wrap(ctx, ddp)
        no_device_ids = keyword(ddp, "device_ids") is None and len(ddp.args) < 2
        if ctx.gpu_job and no_device_ids and not ctx.device_conditional(ddp):
            yield Hit("GD404", ddp)
    if ddp_calls and ctx.gpu_job and not _device_set_before(ctx, ddp_calls[0]):
        yield Hit("GD403", ddp_calls[0])
    if ddp_calls and not _seeded_before(ctx, ddp_calls[0]):
        yield Hit("GD405", ddp_calls[0])


def _statement_of(ctx: ModuleContext, node: ast.AST) -> ast.AST:
    while not isinstance(node, ast.stmt) and node in ctx.parents:
        node = ctx.parents[node]
    return node


def _changed_after_wrap(ctx: ModuleContext, ddp: ast.Call) -> Iterator[Hit]:
    if not ddp.args:
        return
    watched = {ast.unparse(ddp.args[0])}
    statement = _statement_of(ctx, ddp)
    if isinstance(statement, ast.Assign):
        watched.update(ast.unparse(target) for target in statement.targets)
    scope = ctx.scope_of(ddp)
    end = getattr(statement, "end_lineno", None)
    after = end if isinstance(end, int) else int(getattr(statement, "lineno", 0))
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        if getattr(node, "lineno", 0) <= after or ctx.exclusive_branches(statement, node):
            continue
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MOVES + _MODIFIES
            and ast.unparse(node.func.value) in watched
        ):
            yield Hit("GD402", node, f": .{node.func.attr}() on {ast.unparse(node.func.value)}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) in watched:
                    yield Hit("GD402", node, f": {ast.unparse(target)} replaced")


def _first_line(calls: list[ast.Call]) -> int | None:
    return min((call.lineno for call in calls), default=None)


def _device_set_before(ctx: ModuleContext, ddp: ast.Call) -> bool:
    setters = ctx.calls_to(*_SET_DEVICE)
    setters += _device_id_inits(ctx)
    if not setters:  # set in another file of the run (main.py before Trainer(...))
        return any(
            module.calls_to(*_SET_DEVICE) or _device_id_inits(module) for module in ctx.component()
        )
    same_scope = [call for call in setters if ctx.scope_of(call) is ctx.scope_of(ddp)]
    first = _first_line(same_scope)
    return first is None or first < ddp.lineno


def _device_id_inits(ctx: ModuleContext) -> list[ast.Call]:
    return [
        call
        for call in ctx.calls_to("torch.distributed.init_process_group")
        if keyword(call, "device_id") is not None
    ]


def _seeded_before(ctx: ModuleContext, ddp: ast.Call) -> bool:
    seeds = _seed_calls(ctx)
    if not seeds:
        return any(_seed_calls(module) for module in ctx.component() if module is not ctx)
    same_scope = [call for call in seeds if ctx.scope_of(call) is ctx.scope_of(ddp)]
    first = _first_line(same_scope)
    return first is None or first < ddp.lineno


def _seed_calls(ctx: ModuleContext) -> list[ast.Call]:
    return [
        call
        for call in ctx.calls
        if any(
            seed
            in str(
                ctx.call_names.get(call)
                or getattr(call.func, "attr", "")
                or getattr(call.func, "id", "")
            )
            for seed in _SEEDS
        )
    ]
