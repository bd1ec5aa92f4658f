"""GD301, GD302: host synchronisation inside the step loop (GPU jobs only)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext, names_in, terminal_name

_SYNC_METHODS = ("item", "cpu", "numpy", "tolist")


def check(ctx: ModuleContext) -> Iterator[Hit]:
    if not ctx.gpu_job:
        return
    tensor_names = _tensor_names(ctx)
    for call in ctx.calls:
        if not ctx.in_step_loop(call) or ctx.periodic_guard(call):
            continue
        qualified = ctx.call_names.get(call)
        if qualified == "torch.cuda.empty_cache":
            yield Hit("GD302", call)
        elif qualified == "torch.cuda.synchronize":
            yield Hit("GD301", call, ": torch.cuda.synchronize()")
        elif (
            _is_sync_method(call)
            and not _inside_sync_method(ctx, call)
            and not _on_cpu_batch(ctx, call.func.value)  # type: ignore[attr-defined]
        ):
            yield Hit("GD301", call, f": .{call.func.attr}()")  # type: ignore[attr-defined]
        elif isinstance(call.func, ast.Name) and call.func.id == "print":
            printed = sorted({n for arg in call.args for n in names_in(arg)} & tensor_names)
            if printed and not _only_in_sync_calls(call, printed[0]):
                yield Hit("GD301", call, f": print({printed[0]}) formats a tensor")


def _is_sync_method(call: ast.Call) -> bool:
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr in _SYNC_METHODS
        and not call.args
        and not call.keywords
    )


def _inside_sync_method(ctx: ModuleContext, call: ast.Call) -> bool:
    """`x.cpu().numpy()`: report the outer call only."""
    parent = ctx.parents.get(call)
    grand = ctx.parents.get(parent) if parent else None
    return (
        isinstance(parent, ast.Attribute) and isinstance(grand, ast.Call) and _is_sync_method(grand)
    )


def _tensor_names(ctx: ModuleContext) -> set[str]:
    """Names that certainly hold tensors in per-step code: what backward() is called on."""
    names = set()
    for call in ctx.calls:
        if ctx.is_backward(call) and isinstance(call.func, ast.Attribute):
            name = terminal_name(call.func.value)
            if name:
                names.add(name)
    return names


def _only_in_sync_calls(call: ast.Call, name: str) -> bool:
    """print(loss.item()) is reported as .item(), not twice."""
    for node in ast.walk(call):
        if (
            isinstance(node, ast.Call)
            and _is_sync_method(node)
            and name in set(names_in(node.func))
        ):
            return True
    return False


def _on_cpu_batch(ctx: ModuleContext, receiver: ast.AST) -> bool:
    """`labels.numpy()` on a batch straight from the DataLoader (bound by the loop target and
    never moved to the device in the loop) reads host memory: no device sync."""
    while isinstance(receiver, ast.Subscript):
        receiver = receiver.value
    if not isinstance(receiver, ast.Name):
        return False
    loop = next(
        (a for a in ctx.ancestors(receiver) if isinstance(a, (ast.For, ast.AsyncFor))), None
    )
    if loop is None or not ctx.iterates_loader(loop):
        return False
    bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    if receiver.id not in bound:
        return False
    for node in ctx.body_nodes(loop.body):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(n, ast.Name) and n.id == receiver.id
                for t in targets
                for n in ast.walk(t)
            ):
                return False
    return True
