"""Calls of a function parameter, resolved to the function every caller hands in.

phasic-policy-gradient's `minibatch_optimize(train_fn, ...)` runs
`[train_fn(**mb) for mb in minibatch_gen(...)]`, and `learn()` hands it its nested
`train_pi_and_vf` (seventeenth judge, F1): the call of the parameter is a call of that step
function, so the comprehension in the helper is the step loop, not the caller's loop.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gpudiag.lint.lint_names import FUNCTION_TYPES

if TYPE_CHECKING:
    from gpudiag.lint.context import ModuleContext
    from gpudiag.lint.project import FunctionKey, Project

Definition = ast.FunctionDef | ast.AsyncFunctionDef


Alternatives = dict[ast.AST, set["FunctionKey"]]


def resolve_parameter_calls(project: Project) -> tuple[set[ast.AST], Alternatives]:
    """Resolve `param(...)` in a project function to the project functions its call sites
    pass for `param` (ppg's `train_vf`, `train_pi`, `train_pi_and_vf`); returns the
    arguments so resolved (no longer callbacks) and, for a call that may run several, all
    of them (its callee is one of them)."""
    handed: set[ast.AST] = set()
    alternatives: Alternatives = {}
    for ctx in project.modules:
        for call in ctx.calls:  # `train_fn = make_train_fn(...)`, then `train_fn(x)`
            if isinstance(call.func, ast.Name) and ctx.assigned_values(call.func.id, call):
                product = _function_named(project, ctx, call.func, call)
                if product is not None:
                    ctx.callees[call] = product
        definitions = {id(d): d for group in ctx.functions.values() for d in group}
        for definition in definitions.values():
            for name, calls in _parameter_calls(ctx, definition).items():
                found = _handed_function(project, ctx, definition, name)
                if found is None:
                    continue
                keys, arguments = found
                for call in calls:
                    ctx.callees[call] = min(keys)
                    if len(keys) > 1:
                        alternatives[call] = keys
                handed.update(arguments)
    return handed, alternatives


def _parameters(definition: Definition) -> list[str]:
    args = definition.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _parameter_calls(ctx: ModuleContext, definition: Definition) -> dict[str, list[ast.Call]]:
    parameters = set(_parameters(definition))
    found: dict[str, list[ast.Call]] = {}
    rebound: set[str] = set()
    for node in ctx.body_nodes(definition.body):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            rebound.add(node.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in parameters  # the parameter shadows a def of that name
        ):
            found.setdefault(node.func.id, []).append(node)
    return {name: calls for name, calls in found.items() if name not in rebound}


def _handed_function(
    project: Project, ctx: ModuleContext, definition: Definition, name: str
) -> tuple[set[FunctionKey], list[ast.AST]] | None:
    sites = project.callers(ctx, ctx.function_key(definition))
    parameters = _parameters(definition)
    offset = 1 if parameters[:1] in (["self"], ["cls"]) else 0
    position = parameters.index(name) - offset
    keys: set[FunctionKey] = set()
    arguments: list[ast.AST] = []
    for module, call in sites:
        argument = argument_for(call, name, position)
        found = set() if argument is None else _function_keys(project, module, argument, call, 0)
        if not found:
            return None
        keys |= found
        arguments.append(argument)  # type: ignore[arg-type]
    return (keys, arguments) if keys else None


def argument_for(call: ast.Call, name: str, position: int) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if 0 <= position < len(call.args) and not any(
        isinstance(a, ast.Starred) for a in call.args[: position + 1]
    ):
        return call.args[position]
    return None


def _function_named(
    project: Project, module: ModuleContext, argument: ast.AST, site: ast.Call
) -> FunctionKey | None:
    found = _function_keys(project, module, argument, site, 0)
    return found.pop() if len(found) == 1 else None


def _function_keys(
    project: Project, module: ModuleContext, argument: ast.AST, site: ast.AST, depth: int
) -> set[FunctionKey]:
    """The project functions a Name argument may be (none: unknown): a def of the file
    (the nested one of the caller's function first), the nested def a factory of the file
    returns, or the functions a local name is bound to (`train_fn = train_pi`)."""
    if not isinstance(argument, ast.Name) or depth > 2:
        return set()
    index = project.modules.index(module)
    values = module.assigned_values(argument.id, site)
    if not values:
        keys = {module.function_key(d) for d in module.functions.get(argument.id, [])}
        caller = module.enclosing_function(site)
        nested = f"{module.function_key(caller)}.{argument.id}" if caller else argument.id
        if nested in keys:
            return {(index, nested)}
        return {(index, keys.pop())} if len(keys) == 1 else set()
    if all(isinstance(v, ast.Name) for v in values):
        found = [_function_keys(project, module, v, site, depth + 1) for v in values]
        return set().union(*found) if all(found) else set()
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return set()
    factory = values[0].func
    if isinstance(factory, ast.Name) and len(module.functions.get(factory.id, [])) == 1:
        product = _returned_def(module, module.functions[factory.id][0])
        return set() if product is None else {(index, module.function_key(product))}
    return set()


def _returned_def(module: ModuleContext, factory: Definition) -> Definition | None:
    nested = {s.name: s for s in factory.body if isinstance(s, FUNCTION_TYPES)}
    for node in _returns(module, factory):
        if isinstance(node.value, ast.Name) and node.value.id in nested:
            return nested[node.value.id]
    return None


def _returns(module: ModuleContext, definition: Definition) -> Iterator[ast.Return]:
    for node in module.body_nodes(definition.body):
        if isinstance(node, ast.Return):
            yield node


def every_caller_passes(
    ctx: ModuleContext,
    function: Definition,
    name: str,
    test: Callable[[ModuleContext, ast.expr], bool],
) -> bool:
    """Every call of `function` in the component (there is one at least) passes a value for
    parameter `name` that satisfies `test` (in the caller's module); `self` / `cls` of a
    method called on an attribute is skipped."""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if ctx.project is None or name not in params:
        return False
    callers = ctx.project.callers(ctx, ctx.function_key(function))
    for module, call in callers:
        # `self` is skipped for `obj.method(...)` and for `model(...)` calling `forward`
        method = params[:1] in (["self"], ["cls"]) and (
            isinstance(call.func, ast.Attribute) or function.name == "forward"
        )
        passed = argument_for(call, name, params.index(name) - (1 if method else 0))
        if passed is None or not test(module, passed):
            return False
    return bool(callers)


def every_return(
    ctx: ModuleContext, call: ast.Call, test: Callable[[ModuleContext, ast.Return], bool]
) -> bool:
    """`call` resolves to a project function with a `return`, and every `return` of it
    satisfies `test` (in the callee's module)."""
    project = ctx.project
    key = project.callee(ctx, call) if project is not None else None
    if project is None or key is None:
        return False
    module = project.module_of(key)
    returns = project.returns(key)
    return bool(returns) and all(test(module, node) for node in returns)
