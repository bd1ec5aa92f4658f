"""The options a DataLoader gets through its function's `**kwargs` (twentieth judge, M1):
denoiser's `def loader(dataset, *args, shuffle=False, klass=DataLoader, **kwargs)` returns
`klass(dataset, *args, **kwargs, sampler=sampler)` under `if shuffle:`, and its callers
pass `loader(tr_dataset, batch_size=..., shuffle=True, num_workers=...)`: the training
loader gets `batch_size` and `num_workers`, no `pin_memory`.

Followed where statically clear: the `**` name is the function's own `**kwargs`
parameter, never rebound or changed in place; every project call of the function passes
plain keywords (no `**` of its own) and no option by position; the calls that reach the
loader are those whose constants agree with each `if <parameter>:` around it (a parameter
left off takes its default; any other test, or a value the linter cannot read, reaches)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import ModuleContext, is_const

Definition = ast.FunctionDef | ast.AsyncFunctionDef
Options = dict[str, ast.expr]
Forwarded = list[tuple[str, Options]]  # (the call's `path:line`, the options it gives)
_MUTATORS = {"update", "pop", "setdefault", "clear", "popitem"}


def forwarded_options(ctx: ModuleContext, loader: ast.Call) -> Forwarded | None:
    """Per project call reaching the loader, the keyword options the loader gets (its own
    keywords and what the call forwards through `**kwargs`); None when not clear."""
    function = ctx.enclosing_function(loader)
    if function is None or ctx.project is None or function.args.kwarg is None:
        return None
    stars = [kw.value for kw in loader.keywords if kw.arg is None]
    name = function.args.kwarg.arg
    if len(stars) != 1 or not isinstance(stars[0], ast.Name) or stars[0].id != name:
        return None
    if _changed(ctx, function, name):
        return None
    args = function.args
    named = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    positional = len(args.posonlyargs) + len(args.args) - (1 if _is_method(function) else 0)
    own = {kw.arg: kw.value for kw in loader.keywords if kw.arg}
    found: Forwarded = []
    for module, call in reaching_calls(ctx, loader) or []:
        if any(kw.arg is None for kw in call.keywords) or len(call.args) > positional:
            return None  # `**options` of its own, or options given by position
        options = {kw.arg: kw.value for kw in call.keywords if kw.arg and kw.arg not in named}
        found.append((f"{module.path}:{call.lineno}", {**options, **own}))
    return found or None


def weakest(forwarded: Forwarded, name: str) -> ast.expr | None:
    """The value of option `name` that asks least of it: None when some call leaves it
    off, else a false constant when one passes that, else the first value."""
    values = [o.get(name) for _, o in forwarded]
    if any(v is None for v in values):
        return None
    return next((v for v in values if is_const(v, False) or is_const(v, 0)), values[0])


def forwarded_detail(forwarded: Forwarded | None, name: str) -> str:
    """': options come through **kwargs; the call at train.py:28 passes no pin_memory'."""
    sites = [site for site, options in forwarded or [] if name not in options]
    if not sites:
        return ""
    return f": options come through **kwargs; the call at {sites[0]} passes no {name}"


def reaching_calls(
    ctx: ModuleContext, node: ast.AST
) -> list[tuple[ModuleContext, ast.Call]] | None:
    """The project calls of the function around `node` that may run it: for each `if
    <parameter>:` around `node`, those passing (or defaulting to) a constant of the
    branch's truth, or a value the linter cannot read. None without a project function
    or callers."""
    function = ctx.enclosing_function(node)
    if function is None or ctx.project is None:
        return None
    callers = ctx.project.callers(ctx, ctx.function_key(function))
    if not callers:
        return None
    tests = _parameter_tests(ctx, function, node)
    return [(m, call) for m, call in callers if all(_agrees(function, call, t) for t in tests)]


def _parameter_tests(
    ctx: ModuleContext, function: Definition, node: ast.AST
) -> list[tuple[str, bool]]:
    """(parameter, truth) of each `if <parameter>:` around `node`, and of each earlier
    `if <parameter>: ... return` in the blocks around it (node runs when it is false)."""
    tests: list[tuple[str, bool]] = []
    child = node
    for ancestor in ctx.ancestors(node):
        for block in _blocks(ancestor):
            if any(child is s for s in block):
                tests += _early_exits(block[: next(i for i, s in enumerate(block) if s is child)])
        if ancestor is function:
            break
        if isinstance(ancestor, ast.If) and isinstance(ancestor.test, ast.Name):
            tests.append((ancestor.test.id, any(child is s for s in ancestor.body)))
        child = ancestor
    return tests


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    return [
        block
        for field in ("body", "orelse", "finalbody")
        if isinstance(block := getattr(node, field, None), list)
    ]


def _early_exits(before: list[ast.stmt]) -> list[tuple[str, bool]]:
    return [
        (stmt.test.id, False)
        for stmt in before
        if isinstance(stmt, ast.If)
        and isinstance(stmt.test, ast.Name)
        and not stmt.orelse
        and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
    ]


def _agrees(function: Definition, call: ast.Call, test: tuple[str, bool]) -> bool:
    name, wanted = test
    args = function.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    value: ast.expr | None = next((kw.value for kw in call.keywords if kw.arg == name), None)
    if value is None and name in positional:
        index = positional.index(name) - (1 if _is_method(function) else 0)
        if 0 <= index < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args[: index + 1]
        ):
            value = call.args[index]
        elif positional.index(name) >= len(positional) - len(args.defaults):
            value = args.defaults[positional.index(name) - (len(positional) - len(args.defaults))]
    elif value is None:
        kwonly = [a.arg for a in args.kwonlyargs]
        if name in kwonly:
            value = args.kw_defaults[kwonly.index(name)]
    if not isinstance(value, ast.Constant):
        return True  # not readable: it may take the branch
    return bool(value.value) == wanted


def _is_method(function: Definition) -> bool:
    first = [a.arg for a in (*function.args.posonlyargs, *function.args.args)][:1]
    return first in (["self"], ["cls"])


def _changed(ctx: ModuleContext, function: Definition, name: str) -> bool:
    """`kwargs = ...`, `kwargs["x"] = ...`, `kwargs.update(...)` / `.pop(...)` /
    `.setdefault(...)` in the function: the forwarded options are not the callers'."""
    for node in ctx.body_nodes(function.body):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if (
            isinstance(node, (ast.Subscript, ast.Attribute))
            and isinstance(node.value, ast.Name)
            and node.value.id == name
            and (
                node.attr in _MUTATORS
                if isinstance(node, ast.Attribute)
                else not isinstance(node.ctx, ast.Load)
            )
        ):
            return True
    return False
