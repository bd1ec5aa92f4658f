"""A name a nested function reads from the function around it: msn's `criterion =
init_loss()` in `main()`, called inside `def train_step():` that the step loop hands to
a timer (nineteenth judge, M3)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext


def closure_values(ctx: ModuleContext, name: str, site: ast.AST) -> list[ast.expr]:
    """The values bound to `name` in the function around `site`, or, where it binds
    none and has no such parameter, in the functions around that one (a free variable)."""
    node = site
    while True:
        values = ctx.assigned_values(name, node)
        if values:
            return values
        scope = ctx.scope_of(node)
        if not isinstance(scope, FUNCTION_TYPES) or name in _parameters(scope):
            return []
        node = scope


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return {a.arg for a in every}
