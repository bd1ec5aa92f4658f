"""Calls of a function parameter, resolved to the function every caller hands in.

phasic-policy-gradient's `minibatch_optimize(train_fn, ...)` runs
`[train_fn(**mb) for mb in minibatch_gen(...)]`, and `learn()` hands it its nested
`train_pi_and_vf` (seventeenth judge, F1): the call of the parameter is a call of that step
function, so the comprehension in the helper is the step loop, not the caller's loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.lint.lint_names import FUNCTION_TYPES

if TYPE_CHECKING:
    from gpudiag.lint.context import ModuleContext
    from gpudiag.lint.project import FunctionKey, Project

Definition = ast.FunctionDef | ast.AsyncFunctionDef


def resolve_parameter_calls(project: Project) -> set[ast.AST]:
    """Resolve `param(...)` in a project function to the one project function all its call
    sites pass for `param`; returns the arguments so resolved (no longer callbacks)."""
    handed: set[ast.AST] = set()
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
                key, arguments = found
                for call in calls:
                    ctx.callees[call] = key
                handed.update(arguments)
    return handed


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
) -> tuple[FunctionKey, list[ast.AST]] | None:
    sites = project.callers(ctx, ctx.function_key(definition))
    parameters = _parameters(definition)
    offset = 1 if parameters[:1] in (["self"], ["cls"]) else 0
    position = parameters.index(name) - offset
    keys: set[FunctionKey] = set()
    arguments: list[ast.AST] = []
    for module, call in sites:
        argument = argument_for(call, name, position)
        key = None if argument is None else _function_named(project, module, argument, call)
        if key is None:
            return None
        keys.add(key)
        arguments.append(argument)  # type: ignore[arg-type]
    if len(keys) != 1:
        return None
    return keys.pop(), arguments


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
    """The project function a Name argument is: a def of the file (the nested one of the
    caller's function first), or the nested def a factory of the file returns."""
    if not isinstance(argument, ast.Name):
        return None
    index = project.modules.index(module)
    values = module.assigned_values(argument.id, site)
    if not values:
        keys = {module.function_key(d) for d in module.functions.get(argument.id, [])}
        caller = module.enclosing_function(site)
        nested = f"{module.function_key(caller)}.{argument.id}" if caller else argument.id
        if nested in keys:
            return (index, nested)
        return (index, keys.pop()) if len(keys) == 1 else None
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    factory = values[0].func
    if isinstance(factory, ast.Name) and len(module.functions.get(factory.id, [])) == 1:
        product = _returned_def(module, module.functions[factory.id][0])
        return None if product is None else (index, module.function_key(product))
    return None


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
