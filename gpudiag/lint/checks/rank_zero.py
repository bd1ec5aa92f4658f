"""GD701-GD704: work every rank repeats, and synchronisation in the step loop."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import (
    RANK_NAME,
    ModuleContext,
    is_const,
    keyword,
    names_in,
    terminal_name,
)

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
            if (
                not ctx.rank_guarded(call)
                and not _per_rank_file(ctx, call, qualified)
                and not _to_memory(ctx, call, qualified)
            ):
                yield Hit("GD701", call)
        elif _is_logging(call):
            if (
                ctx.in_training_loop(call)
                and not _rank_zero_output(ctx, call)
                and not _per_rank_warning(call)
            ):
                yield Hit("GD702", call)
        elif qualified == "torch.distributed.barrier":
            if ctx.in_step_loop(call) and not ctx.periodic_guard(call):
                yield Hit("GD703", call)
        elif (
            qualified in _COLLECTIVES
            and ctx.in_step_loop(call)
            and not ctx.periodic_guard(call)
            and not _overlapped(ctx, call)
            and not ctx.in_eval_loop_only(call)
            and not _agrees_on_a_flag(ctx, call)
        ):
            yield Hit("GD704", call, f": {qualified.rsplit('.', 1)[1]}")


def _overlapped(ctx: ModuleContext, call: ast.Call) -> bool:
    """Started with `async_op=True` and not waited for at once: `work = all_reduce(t,
    async_op=True)` followed straight by `work.wait()` (pycls's `scaled_all_reduce`) is
    a synchronous collective."""
    return is_const(keyword(call, "async_op"), True) and not _waited_at_once(ctx, call)


def _waited_at_once(ctx: ModuleContext, call: ast.Call) -> bool:
    """The first statement after the collective's (one level up at a time, past only
    bookkeeping: `works.append(work)`, other collectives) waits for a result."""
    child: ast.AST = call
    for ancestor in ctx.ancestors(call):
        block = _block_of(ancestor, child)
        if block is not None and isinstance(child, ast.stmt):
            following = block[block.index(child) + 1 :]
            work = [stmt for stmt in following if not _bookkeeping(ctx, stmt)]
            if work:
                return _waits(work[0])
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child = ancestor
    return False


def _block_of(parent: ast.AST, child: ast.AST) -> list[ast.stmt] | None:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and child in block:
            return block
    return None


def _bookkeeping(ctx: ModuleContext, stmt: ast.stmt) -> bool:
    """No work but collecting handles or starting more collectives."""
    return all(
        terminal_name(node.func) in ("append", "extend")
        or ctx.call_names.get(node, "") in _COLLECTIVES
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call)
    )


def _waits(stmt: ast.stmt) -> bool:
    return any(
        isinstance(node, ast.Call) and terminal_name(node.func) in ("wait", "synchronize")
        for node in ast.walk(stmt)
    )


_FLAG_NAME = re.compile(r"found_inf|overflow|non_?finite|isfinite|isnan|skip|early_stop", re.I)


def _agrees_on_a_flag(ctx: ModuleContext, call: ast.Call) -> bool:
    """The collective reduces a decision every rank must share (GradScaler's `found_inf`,
    an overflow or skip flag: nanochat's MAX all-reduce so that all ranks skip the same
    step): required for correctness, not avoidable per-step communication."""
    if not call.args:
        return False
    tensor = call.args[0]
    sources: list[ast.AST] = [tensor]
    if isinstance(tensor, ast.Name):
        sources += [
            loop.iter
            for loop in ctx.ancestors(call)
            if isinstance(loop, (ast.For, ast.AsyncFor)) and tensor.id in set(names_in(loop.target))
        ]
    return any(_FLAG_NAME.search(name) for source in sources for name in names_in(source))


def _per_rank_warning(call: ast.Call) -> bool:
    """A warning that says which rank it comes from (`logger.warning("Rank {} trying to
    all-gather {:.2f} GB".format(get_rank(), ...))`): a per-rank diagnostic on purpose, not
    a metric every rank repeats (a `print` of the rank's loss still is)."""
    if terminal_name(call.func) != "warning":
        return False
    values = [*call.args, *(kw.value for kw in call.keywords)]
    return any(RANK_NAME.search(name) for value in values for name in names_in(value))


def _rank_zero_output(ctx: ModuleContext, call: ast.Call) -> bool:
    """Logged on rank 0 only: under a rank-0 guard, or a `print` once `builtins.print` was
    replaced at start-up by one that prints on the master only (torchvision references',
    DeiT's `setup_for_distributed`), or a deliberate `print(..., force=True)`."""
    if ctx.rank_guarded(call):
        return True
    if not (isinstance(call.func, ast.Name) and call.func.id == "print"):
        return _rank_aware_logger(ctx, terminal_name(call.func.value))  # type: ignore[attr-defined]
    return keyword(call, "force") is not None or any(
        _replaces_print(module) for module in ctx.component()
    )


def _rank_aware_logger(ctx: ModuleContext, name: str) -> bool:
    """The logger decides per rank what to write: it was set up with the rank
    (`logger = create_logger(output_dir, dist_rank=rank)`, `setup_logger(distributed_rank=...)`)
    or it is a module of the project that tests the rank itself (a `logger.py` whose
    `configure()` gives ranks > 0 their own file or no console output)."""
    if name in ("wandb", "logging"):
        return False
    if any(name in module.rank_configured_names() for module in ctx.component()):
        return True
    if _rank_testing_module(ctx, name):
        return True
    # `logger = logging.get_logger(__name__)` where `logging` is the project's module whose
    # `setup_logging()` configures output on the main process only (pycls)
    return any(
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and _rank_testing_module(ctx, terminal_name(value.func.value))
        for value in ctx.assigned_values(name, ctx.tree)
    )


def _rank_testing_module(ctx: ModuleContext, name: str) -> bool:
    dotted = ctx.aliases.get(name)
    found = ctx.project.module_named(ctx, dotted) if dotted and ctx.project else None
    return found is not None and found.tests_rank()


def _replaces_print(ctx: ModuleContext) -> bool:
    """`builtins.print = print` / `__builtin__.print = print` somewhere in the module."""
    return any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(target, ast.Attribute)
            and target.attr == "print"
            and terminal_name(target.value) in ("builtins", "__builtin__")
            for target in node.targets
        )
        for node in ctx.parents
    )


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


def _to_memory(ctx: ModuleContext, call: ast.Call, qualified: str) -> bool:
    """`torch.save(obj, buffer)` with `buffer = io.BytesIO()`: serialised in memory, no file."""
    if qualified != "torch.save":
        return False
    target = call.args[1] if len(call.args) > 1 else keyword(call, "f")
    if not isinstance(target, ast.Name):
        return False
    scope = ctx.scope_of(call)
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == target.id for t in node.targets)
        and isinstance(node.value, ast.Call)
        and terminal_name(node.value.func) in ("BytesIO", "StringIO")
        for node in ctx.body_nodes(scope.body)  # type: ignore[attr-defined]
    )


def _is_logging(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "print"
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _LOG_METHODS
        and bool(_LOGGER_RECEIVER.match(terminal_name(func.value)))
    )
