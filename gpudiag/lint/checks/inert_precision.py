"""Reduced-precision dtypes named without being used (seventeenth judge, M4).

phasic-policy-gradient trains in fp32, but names `th.float16` in a generic string -> dtype
parser (`elif x == "float16": return th.float16`, no call asks for it) and in a test
`if dtype == th.float16:` no call makes true: neither makes the job mixed precision.
"""

from __future__ import annotations

import ast
from collections.abc import Set as AbstractSet

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, terminal_name
from gpudiag.lint.parameter_calls import argument_for


def inert_only(ctx: ModuleContext, names: AbstractSet[str]) -> bool:
    """Every reduced-precision name of the module (`names`) is only compared with
    (`dtype == th.float16`) or returned by a string -> dtype parser for strings no call
    passes; a keyword of that name (`mixed_precision=...`) is a use."""
    uses: list[ast.AST] = []
    for node in ctx.parents:
        if isinstance(node, ast.keyword) and node.arg in names:
            return False
        if isinstance(node, (ast.Name, ast.Attribute)) and terminal_name(node) in names:
            uses.append(node)
    return bool(uses) and all(
        _compared(ctx, n, {*names, "half"}) or _parsed_unasked(ctx, n) for n in uses
    )


def _compared(ctx: ModuleContext, node: ast.AST, names: set[str]) -> bool:
    """`if dtype == th.float16:` where `dtype` is a parameter (possibly passed through a
    dtype parser, `dtype = parse_dtype(dtype)`) no call hands a reduced-precision dtype;
    `self._dtype == torch.float16` of a dtype read from a config (torchtune) is not."""
    parent = ctx.parents.get(node)
    if not (
        isinstance(parent, ast.Compare)
        and len(parent.ops) == 1
        and isinstance(parent.ops[0], (ast.Eq, ast.NotEq))
    ):
        return False
    other = parent.left if parent.comparators[0] is node else parent.comparators[0]
    function = ctx.enclosing_function(node)
    if not isinstance(other, ast.Name) or function is None or ctx.project is None:
        return False
    for value in ctx.assigned_values(other.id, node):
        key = ctx.project.callee(ctx, value) if isinstance(value, ast.Call) else None
        if key is None or not (
            all(
                _returns_dtypes(ctx.project.module_of(key), d) for d in ctx.project.definitions(key)
            )
            and [ast.dump(a) for a in value.args[:1]] == [ast.dump(other)]  # type: ignore[attr-defined]
        ):
            return False
    return _parameter_never(ctx, function, other.id, names, 0)


def _parsed_unasked(ctx: ModuleContext, node: ast.AST) -> bool:
    """`return th.float16` in `if x == "float16" or x == "half":` of a function whose
    calls all pass other string constants for `x` (or that nothing calls)."""
    if not isinstance(ctx.parents.get(node), ast.Return):
        return False
    function = ctx.enclosing_function(node)
    branch = _string_branch(ctx, node)
    if function is None or branch is None or ctx.project is None:
        return False
    name, strings = branch
    return _parameter_never(ctx, function, name, strings, 0)


def _parameter_never(
    ctx: ModuleContext,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    name: str,
    strings: set[str],
    depth: int,
) -> bool:
    """No call of `function` (nor its default) gives parameter `name` one of `strings`,
    also through a parameter of the caller handed on (`parse_dtype(dtype)` in
    `NormedLinear(..., dtype=th.float32)`)."""
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    defaults: dict[str, ast.expr | None] = dict.fromkeys(names)
    defaults.update(zip(names[len(names) - len(args.defaults) :], args.defaults, strict=True))
    defaults.update(zip([a.arg for a in args.kwonlyargs], args.kw_defaults, strict=True))
    if name not in defaults or ctx.project is None or depth > 2:
        return False
    offset = 1 if names[:1] in (["self"], ["cls"]) else 0
    position = names.index(name) - offset if name in names else -1
    default = defaults[name]
    for module, call in ctx.project.callers(ctx, ctx.function_key(function)):
        value = argument_for(call, name, position)
        if value is None and _unpacks(call):
            return False  # `f(*args, **kwargs)`: unknown
        value = value or default
        if value is None or not _never(module, value, call, strings, depth):
            return False
    return True


def _never(
    ctx: ModuleContext, value: ast.expr, site: ast.AST, strings: set[str], depth: int
) -> bool:
    """`value` is none of `strings`: another string, a dtype attribute (`th.float32`),
    or a parameter of the caller that is never one of them either."""
    if isinstance(value, ast.Constant):
        return value.value not in strings
    if isinstance(value, ast.Attribute):  # `th.float32`, not `args.dtype`
        return value.attr not in strings and (ctx.qualify(value) or "").startswith("torch.")
    if isinstance(value, ast.Call) and ctx.project is not None:  # `parse_dtype("float32")`
        key = ctx.project.callee(ctx, value)
        return (
            key is not None
            and all(
                _returns_dtypes(ctx.project.module_of(key), d) for d in ctx.project.definitions(key)
            )
            and not _unpacks(value)
            and all(_never(ctx, a, site, strings, depth + 1) for a in value.args)
            and all(_never(ctx, k.value, site, strings, depth + 1) for k in value.keywords)
        )
    if isinstance(value, ast.Name):
        caller = ctx.enclosing_function(site)
        return caller is not None and _parameter_never(ctx, caller, value.id, strings, depth + 1)
    return False


def _string_branch(ctx: ModuleContext, node: ast.AST) -> tuple[str, set[str]] | None:
    """(parameter, strings) of the `if p == "a" or p == "b":` whose body holds `node`."""
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, FUNCTION_TYPES):
            return None
        if isinstance(ancestor, ast.If) and any(child is s for s in ancestor.body):
            return _string_test(ancestor.test)
        child = ancestor
    return None


def _string_test(test: ast.expr) -> tuple[str, set[str]] | None:
    tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    name, strings = "", set()
    for part in tests:
        if not (
            isinstance(part, ast.Compare)
            and isinstance(part.left, ast.Name)
            and len(part.ops) == 1
            and isinstance(part.ops[0], ast.Eq)
            and isinstance(part.comparators[0], ast.Constant)
            and isinstance(part.comparators[0].value, str)
        ):
            return None
        if name and part.left.id != name:
            return None
        name = part.left.id
        strings.add(part.comparators[0].value)
    return (name, strings) if name else None


def _returns_dtypes(
    module: ModuleContext, definition: ast.FunctionDef | ast.AsyncFunctionDef
) -> bool:
    """Every `return` gives a torch attribute (a dtype) or the parameter it was handed."""
    params = {a.arg for a in (*definition.args.posonlyargs, *definition.args.args)}
    returns = [n for n in module.body_nodes(definition.body) if isinstance(n, ast.Return)]
    return bool(returns) and all(
        (
            isinstance(r.value, ast.Attribute)
            and (module.qualify(r.value) or "").startswith("torch.")
        )
        or (isinstance(r.value, ast.Name) and r.value.id in params)
        for r in returns
    )


def _unpacks(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords) or any(
        isinstance(a, ast.Starred) for a in call.args
    )
