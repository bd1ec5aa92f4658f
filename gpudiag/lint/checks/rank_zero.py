"""GD701-GD704: work every rank repeats, and synchronisation in the step loop."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import RANK_NAME, ModuleContext, keyword, names_in, terminal_name

_COLLECTIVES = {
    f"torch.distributed.{name}"
    for name in (
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_all_single",
    )
}
_LOGGER_RECEIVER = re.compile(
    r"^(log|logger|logging|_logger|LOGGER|wandb|writer|tb_writer|summary_writer)$"
)
_LOG_METHODS = {"info", "warning", "debug", "log", "add_scalar", "add_scalars", "add_histogram"}


def check(ctx: ModuleContext) -> Iterator[Hit]:
    if not ctx.ddp_code:
        return
    for call in ctx.calls:
        qualified = ctx.call_names.get(call, "")
        if _is_save(ctx, call, qualified):
            if not ctx.rank_guarded(call) and not _per_rank_file(ctx, call, qualified):
                yield Hit("GD701", call)
        elif _is_logging(call):
            if ctx.in_training_loop(call) and not ctx.rank_guarded(call):
                yield Hit("GD702", call)
        elif qualified == "torch.distributed.barrier":
            if ctx.in_step_loop(call) and not ctx.periodic_guard(call):
                yield Hit("GD703", call)
        elif qualified in _COLLECTIVES and ctx.in_step_loop(call) and not ctx.periodic_guard(call):
            yield Hit("GD704", call, f": {qualified.rsplit('.', 1)[1]}")


def _is_save(ctx: ModuleContext, call: ast.Call, qualified: str) -> bool:
    if qualified == "torch.save":
        return True
    return isinstance(call.func, ast.Attribute) and call.func.attr == "save_pretrained"


def _per_rank_file(ctx: ModuleContext, call: ast.Call, qualified: str) -> bool:
    """torch.save(x, f"logits_rank{rank}.pt"): each rank writes a file of its own (a
    sharded or per-rank dump), not the same checkpoint N times."""
    if qualified == "torch.save":
        target = call.args[1] if len(call.args) > 1 else keyword(call, "f")
    else:  # model.save_pretrained(save_directory)
        target = call.args[0] if call.args else keyword(call, "save_directory")
    if target is None:
        return False
    return any(RANK_NAME.search(name) for name in names_in(target))


def _is_logging(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "print"
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _LOG_METHODS
        and bool(_LOGGER_RECEIVER.match(terminal_name(func.value)))
    )
