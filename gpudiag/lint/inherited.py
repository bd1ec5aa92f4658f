"""Methods a project class inherits from a project base class (eighteenth judge, M1: XLM's
`trainer = SingleTrainer(...)` / `EncDecTrainer(...)`, whose `mlm_step`, `optimize`... are
defined in their base `Trainer`): `trainer.step(x)` calls the base class's `step`, also
when the name is bound to instances of several subclasses that all inherit that one
definition."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext

if TYPE_CHECKING:
    from gpudiag.lint.project import FunctionKey, Project

_MAX_DEPTH = 4


def defining_class(project: Project, class_key: FunctionKey, method: str) -> FunctionKey | None:
    """(module, `Class.method`) of the nearest class of the hierarchy (the class itself,
    then its project base classes, depth first as written) that defines `method`."""
    pending: list[tuple[ModuleContext, ast.ClassDef, int]] = []
    module = project.modules[class_key[0]]
    definition = module.classes.get(class_key[1])
    if definition is not None:
        pending.append((module, definition, 0))
    while pending:
        module, current, depth = pending.pop(0)
        if any(isinstance(s, FUNCTION_TYPES) and s.name == method for s in current.body):
            return (project.modules.index(module), f"{current.name}.{method}")
        if depth >= _MAX_DEPTH:
            continue
        for base in current.bases:
            if isinstance(base, (ast.Name, ast.Attribute)):
                parent = project.class_of_call(module, ast.Call(func=base, args=[], keywords=[]))
                if parent is not None and parent[1] is not current:
                    pending.append((parent[0], parent[1], depth + 1))
    return None


def instance_calls(ctx: ModuleContext, name: str) -> list[ast.Call]:
    """Every call `name` is bound to in the file (`trainer = SingleTrainer(...)` in one
    branch, `trainer = EncDecTrainer(...)` in the other); empty when it is also bound to
    anything else."""
    calls: list[ast.Call] = []
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            if not isinstance(node.value, ast.Call):
                return []
            calls.append(node.value)
    return calls


def inherited_self_call(
    project: Project, index: int, ctx: ModuleContext, call: ast.Call
) -> FunctionKey | None:
    """`self.optimize(loss)` in a method of a class that does not define `optimize` itself:
    the base class's method (XLM's `EncDecTrainer.mt_step` calling `Trainer.optimize`)."""
    func = call.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in ("self", "cls")
    ):
        return None
    owner = next((a for a in ctx.ancestors(call) if isinstance(a, ast.ClassDef)), None)
    if owner is None or any(
        isinstance(s, FUNCTION_TYPES) and s.name == func.attr for s in owner.body
    ):
        return None
    return defining_class(project, (index, owner.name), func.attr)
