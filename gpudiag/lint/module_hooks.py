"""Module hooks run where the module runs (twenty-first judge, M2).

`self.a.register_forward_hook(self._log)` in `Net.__init__`, `for m in [self.a, self.b]:
m.register_forward_hook(hook)`, or `hooks = [h1, h2]; for h in hooks:
model.register_full_backward_hook(h)`: each forward (or backward) of the module calls the
hook, so where `Net.forward` is per-step code the hook's body is too. Resolved only when
the module's project class is known (the class around `self`, or a name bound to one
project class, `parameter_modules.name_class`) and the hook is a function of the project
(a def of the file or imported, `self.<method>`, `functools.partial` of one), each through a literal
list or tuple of them when registered in a loop. A hook whose handle is kept in a file that
calls `.remove()` (a one-off measurement: register, run one forward, remove), or that is
registered under an `if` (a switch, possibly opt-in), is not followed.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudiag.lint.inherited import defining_class
from gpudiag.lint.lint_names import FUNCTION_TYPES
from gpudiag.lint.parameter_modules import name_class

if TYPE_CHECKING:
    from gpudiag.lint.context import ModuleContext
    from gpudiag.lint.project import FunctionKey, Project

HOOK_METHODS = {
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
}


def module_hooks(project: Project) -> dict[FunctionKey, set[FunctionKey]]:
    """The module's `forward` -> the project functions registered as its hooks."""
    found: dict[FunctionKey, set[FunctionKey]] = {}
    for ctx in project.modules:
        for call in ctx.calls:
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr in HOOK_METHODS and call.args):
                continue
            if _removed(ctx, call) or _conditional(ctx, call):
                continue
            hooks = set()
            for hook in _elements(ctx, call.args[0], call):
                hooks |= _hook_functions(project, ctx, hook, call)
            if not hooks:
                continue
            for receiver in _elements(ctx, func.value, call):
                owner = _owner(project, ctx, receiver, call)
                forward = defining_class(project, owner, "forward") if owner else None
                if forward is not None:
                    found.setdefault(forward, set()).update(hooks)
    return found


def _elements(ctx: ModuleContext, node: ast.expr, site: ast.AST) -> list[ast.expr]:
    """`node` itself, or the elements of the literal list / tuple a loop target iterates
    (`for m in [self.a, self.b]:`, `for h in hooks:` with `hooks = [h1, h2]` bound once)."""
    if not isinstance(node, ast.Name):
        return [node]
    loop = next(
        (
            a
            for a in ctx.ancestors(site)
            if isinstance(a, (ast.For, ast.AsyncFor))
            and isinstance(a.target, ast.Name)
            and a.target.id == node.id
        ),
        None,
    )
    if loop is None:
        return [node]
    iterated = loop.iter
    if isinstance(iterated, ast.Name):
        values = ctx.assigned_values(iterated.id, loop)
        iterated = values[0] if len(values) == 1 else iterated
    if isinstance(iterated, (ast.List, ast.Tuple)) and not any(
        isinstance(e, ast.Starred) for e in iterated.elts
    ):
        return list(iterated.elts)
    return []  # a loop over something else: its elements are unknown


def _owner(
    project: Project, ctx: ModuleContext, receiver: ast.expr, site: ast.AST
) -> FunctionKey | None:
    """The project class whose forward runs the receiver: the class around `self` for
    `self` / `self.a` / `self.blocks[0]`, or the class of a name (`net.a`, `model`)."""
    root = receiver
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value
    if not isinstance(root, ast.Name):
        return None
    if root.id == "self":
        owner = next((a for a in ctx.ancestors(site) if isinstance(a, ast.ClassDef)), None)
        return (project.index_of(ctx), owner.name) if owner is not None else None
    return name_class(project, ctx, root.id, site)


def _hook_functions(
    project: Project, ctx: ModuleContext, hook: ast.expr, site: ast.AST
) -> set[FunctionKey]:
    if isinstance(hook, ast.Call) and _is_partial(hook) and hook.args:
        return _hook_functions(project, ctx, hook.args[0], site)
    if isinstance(hook, (ast.Name, ast.Attribute)):
        probe = ast.Call(func=hook, args=[], keywords=[])
        ctx.parents[probe] = site  # resolved like a call written at the registration
        try:
            key = project.resolve_call(ctx, probe)
        finally:
            del ctx.parents[probe]
        if key is not None and any(isinstance(d, FUNCTION_TYPES) for d in project.definitions(key)):
            return {key}
    return set()


def _is_partial(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "partial") or (
        isinstance(func, ast.Attribute) and func.attr == "partial"
    )


def _conditional(ctx: ModuleContext, call: ast.Call) -> bool:
    """Registered under an `if` of its function (`if args.log_activations:`): a switch
    the linter would have to judge (opt-in or not); left alone rather than guessed."""
    for ancestor in ctx.ancestors(call):
        if isinstance(ancestor, (ast.If, ast.IfExp)):
            return True
        if isinstance(ancestor, FUNCTION_TYPES):
            return False
    return False


def _removed(ctx: ModuleContext, call: ast.Call) -> bool:
    """The handle is kept (the registration is not a statement of its own) and the file
    calls `.remove()` of something (a handle: `list.remove` takes an argument)."""
    if isinstance(ctx.parents.get(call), ast.Expr):
        return False
    return any(
        isinstance(node.func, ast.Attribute) and node.func.attr == "remove" and not node.args
        for node in ctx.calls
    )
