"""`model(x)` where `model` reaches its function as a parameter (twenty-first judge, M1):
`def train(model, loader): model = DDP(model, ...); ... model(x)` with `train(Net().cuda(),
...)` in the entry script, or `model = build(Net())` with `def build(m): return DDP(m)` in
another module. nn.Module's `__call__` runs the class's `forward` every step, so its syncs
are per-step code. Resolved after every other call of the run (the call sites of a
parameter's function must be known), and only when every path gives one project class:
each call site of the function passes an instance of it (`Net()`, `Net().cuda()`, a name
bound only to one, a project function every `return` of which is one), and the function
binds the name to nothing else; one site the linter cannot read leaves the call unresolved.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudiag.lint.inherited import WRAPPERS, defining_class
from gpudiag.lint.parameter_calls import argument_for

if TYPE_CHECKING:
    from gpudiag.lint.context import ModuleContext
    from gpudiag.lint.project import FunctionKey, Project

_MAX_DEPTH = 10
# a function's definition (by id) -> the call whose `return` is being resolved
Sites = dict[int, tuple["ModuleContext", ast.Call]]
_MOVES = {"cuda", "to", "train", "eval", "float", "half", "bfloat16", "double"}


def resolve_parameter_modules(project: Project) -> None:
    """Give each unresolved `name(...)` call whose name holds a module handed in as a
    parameter the `forward` of that module's one project class."""
    resolved: list[tuple[ModuleContext, ast.Call, FunctionKey]] = []
    _MEMO.clear()
    for ctx in project.modules:
        for call in ctx.calls:
            if call in ctx.callees or not isinstance(call.func, ast.Name):
                continue
            if not _reaches_parameter(ctx, call.func.id, call):
                continue
            found = _name_class(project, ctx, call.func.id, call, 0, {})
            if found is None or defining_class(project, found, "__call__") is not None:
                continue
            forward = defining_class(project, found, "forward")
            if forward is not None:
                resolved.append((ctx, call, forward))
    for ctx, call, forward in resolved:
        ctx.callees[call] = forward
    _MEMO.clear()


def _reaches_parameter(ctx: ModuleContext, name: str, site: ast.AST) -> bool:
    """Cheap filter: `name` is bound in its function or is a parameter of it (not a
    builtin or an import)."""
    if ctx.assigned_values(name, site):
        return True
    definition = ctx.enclosing_function(site)
    return definition is not None and name in _parameters(definition)


def _parameters(definition: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = definition.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return [n for n in names if n not in ("self", "cls")]


def name_class(
    project: Project, ctx: ModuleContext, name: str, site: ast.AST
) -> FunctionKey | None:
    """The one project module class `name` holds at `site` (through its bindings, the
    callers' arguments for a parameter, project functions returning one), or None."""
    try:
        return _name_class(project, ctx, name, site, 0, {})
    finally:
        _MEMO.clear()


# (project, site, name, the calls whose returns are being resolved) -> the answer; None
# while in progress, so a cycle of calls (`a(m)` calls `b(m)` calls `a(m)`) answers None.
# Without it the callers' callers fan out exponentially (eight copies of one file).
_MEMO: dict[tuple[int, int, str, tuple[tuple[int, int], ...]], FunctionKey | None] = {}


def _name_class(
    project: Project, ctx: ModuleContext, name: str, site: ast.AST, depth: int, sites: Sites
) -> FunctionKey | None:
    if depth > _MAX_DEPTH:
        return None
    key = (id(project), id(site), name, tuple(sorted((k, id(v[1])) for k, v in sites.items())))
    if key in _MEMO:
        return _MEMO[key]
    _MEMO[key] = None
    _MEMO[key] = _bound_class(project, ctx, name, site, depth, sites)
    return _MEMO[key]


def _bound_class(
    project: Project, ctx: ModuleContext, name: str, site: ast.AST, depth: int, sites: Sites
) -> FunctionKey | None:
    """The one project class every value `name` may hold at `site` is an instance of:
    its bindings in the function (not the one `site` is part of: in `model = DDP(model)`
    the inner name is the earlier value) and, for a parameter, what the callers pass."""
    inside = {id(site), *(id(a) for a in ctx.ancestors(site))}
    values = [v for v in ctx.assigned_values(name, site) if id(v) not in inside]
    found = {_value_class(project, ctx, v, depth + 1, sites) for v in values}
    definition = ctx.enclosing_function(site)
    if definition is not None and name in _parameters(definition):
        found.add(_parameter_class(project, ctx, definition, name, depth + 1, sites))
    if len(found) != 1:
        return None
    return found.pop()


def _parameter_class(
    project: Project,
    ctx: ModuleContext,
    definition: ast.FunctionDef | ast.AsyncFunctionDef,
    name: str,
    depth: int,
    sites: Sites,
) -> FunctionKey | None:
    """What the callers pass for the parameter: the one call whose `return` is being
    resolved (`build(Head().cuda())`), else every call of the function in the component."""
    calls = [sites[id(definition)]] if id(definition) in sites else None
    calls = calls or project.callers(ctx, ctx.function_key(definition))
    every = [a.arg for a in (*definition.args.posonlyargs, *definition.args.args)]
    method = every[:1] in (["self"], ["cls"])
    found: set[FunctionKey | None] = set()
    for module, call in calls:
        offset = 1 if method and isinstance(call.func, ast.Attribute) else 0
        position = every.index(name) - offset if name in every else -1
        argument = argument_for(call, name, position)
        if argument is None:
            return None
        found.add(_expr_class(project, module, argument, call, depth + 1, sites))
    return found.pop() if len(found) == 1 else None


def _expr_class(
    project: Project, ctx: ModuleContext, expr: ast.expr, site: ast.AST, depth: int, sites: Sites
) -> FunctionKey | None:
    if isinstance(expr, ast.Name):
        return _name_class(project, ctx, expr.id, site, depth, sites)
    return _value_class(project, ctx, expr, depth, sites)


def _value_class(
    project: Project, ctx: ModuleContext, value: ast.expr, depth: int, sites: Sites
) -> FunctionKey | None:
    """`Net()`, `Net().cuda()`, `DDP(net, ...)`, or a project function returning one."""
    if depth > _MAX_DEPTH or not isinstance(value, ast.Call):
        return None
    if ctx.call_names.get(value) in WRAPPERS:
        inner = value.args[0] if value.args else None
        return _expr_class(project, ctx, inner, value, depth + 1, sites) if inner else None
    if isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
        return _expr_class(project, ctx, value.func.value, value, depth + 1, sites)
    made = project.class_of_call(ctx, value)
    if made is not None:
        return (project.index_of(made[0]), made[1].name)
    callee = project.callee(ctx, value)
    if callee is None or "." in callee[1]:
        return None
    module = project.module_of(callee)
    called = dict(sites)
    called.update({id(d): (ctx, value) for d in project.definitions(callee)})
    found = {
        _expr_class(project, module, r.value, r, depth + 1, called) if r.value else None
        for r in project.returns(callee)
    }
    return found.pop() if len(found) == 1 else None
