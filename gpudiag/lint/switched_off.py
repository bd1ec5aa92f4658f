"""Step functions made by a factory called with training switched off.

score_sde's `eval_step = losses.get_step_fn(..., train=False)` returns the nested
`step_fn`, whose `if train: loss.backward(); optimize_fn(...)` never runs for that call
(seventeenth judge, F5): a loop calling `eval_step(...)` evaluates, it does not train.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudiag.lint.lint_names import FUNCTION_TYPES
from gpudiag.lint.parameter_calls import argument_for

if TYPE_CHECKING:
    from gpudiag.lint.context import ModuleContext
    from gpudiag.lint.project import FunctionKey, Project

_OFF = (False, 0, None)


def switched_off_calls(project: Project, steps: set[FunctionKey]) -> set[ast.AST]:
    """Calls of a step function some factory made, where every step of that function is
    under `if <parameter>:` of the factory and the factory's call leaves it off."""
    found: set[ast.AST] = set()
    for ctx in project.modules:
        for call, key in ctx.callees.items():
            if key not in steps or not isinstance(call.func, ast.Name):
                continue
            values = ctx.assigned_values(call.func.id, call)
            made = values[0] if len(values) == 1 else None
            if isinstance(made, ast.Call) and _switched_off(project, ctx, made, key, steps):
                found.add(call)
    return found


def _switched_off(
    project: Project,
    ctx: ModuleContext,
    factory_call: ast.Call,
    key: FunctionKey,
    steps: set[FunctionKey],
) -> bool:
    factory = project.callee(ctx, factory_call)
    if factory is None or factory[0] != key[0]:
        return False
    module = project.module_of(key)
    products = project.definitions(key)
    factories = project.definitions(factory)
    if len(products) != 1 or len(factories) != 1:
        return False
    if module.enclosing_function(products[0]) is not factories[0]:
        return False
    off = _parameters_left_off(factories[0], factory_call)
    step_calls = [
        node
        for node in module.body_nodes(products[0].body)
        if isinstance(node, ast.Call)
        and (module.is_step_call(node) or project.callee(module, node) in steps)
    ]
    return bool(off and step_calls) and all(_under_switch(module, c, off) for c in step_calls)


def _parameters_left_off(
    definition: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call
) -> set[str]:
    """The factory's parameters the call passes a false constant."""
    args = definition.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    offset = 1 if names[:1] in (["self"], ["cls"]) else 0
    off: set[str] = set()
    for name in [*names, *(a.arg for a in args.kwonlyargs)]:
        position = names.index(name) - offset if name in names else -1
        value = argument_for(call, name, position)
        if isinstance(value, ast.Constant) and value.value in _OFF:
            off.add(name)
    return off


def _under_switch(module: ModuleContext, node: ast.AST, off: set[str]) -> bool:
    child = node
    for ancestor in module.ancestors(node):
        if isinstance(ancestor, FUNCTION_TYPES):
            return False
        if (
            isinstance(ancestor, ast.If)
            and isinstance(ancestor.test, ast.Name)
            and ancestor.test.id in off
            and any(child is stmt for stmt in ancestor.body)
        ):
            return True
        child = ancestor
    return False
