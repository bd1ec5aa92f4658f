"""A DataLoader built through a parameter whose default is the class (denoiser's
`def loader(dataset, *args, shuffle=False, klass=DataLoader, **kwargs)`, then
`klass(dataset, *args, **kwargs, sampler=sampler)`; twentieth judge, M1): the call is a
DataLoader call where statically clear, that is where the parameter is not rebound in
the function and no call of the function in its file passes another class for it."""

from __future__ import annotations

import ast

from gpudiag.lint.context import DATALOADER, FUNCTION_TYPES, ModuleContext, terminal_name


def default_class_loaders(ctx: ModuleContext) -> None:
    for node in ast.walk(ctx.tree):
        if not isinstance(node, FUNCTION_TYPES):
            continue
        for name in _loader_defaults(ctx, node):
            if ctx.assigned_values(name, node.body[0]) or _given_another(ctx, node, name):
                continue
            for call in list(ctx.body_nodes(node.body)):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == name
                    and call not in ctx.call_names
                ):
                    ctx.rename_call(call, DATALOADER)


def _loader_defaults(
    ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> list[str]:
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    pairs = list(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    return [a.arg for a, default in pairs if ctx.qualify(default) == DATALOADER]


def _given_another(
    ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> bool:
    """A call of the function in the file passes something other than DataLoader for
    `name` (by keyword; a positional one counts when it reaches the parameter's place)."""
    args = function.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    for call in ctx.calls:
        if terminal_name(call.func) != function.name:
            continue
        given = [kw.value for kw in call.keywords if kw.arg == name]
        if name in positional and len(call.args) > positional.index(name):
            given.append(call.args[positional.index(name)])
        if any(ctx.qualify(value) != DATALOADER for value in given):
            return True
    return False
