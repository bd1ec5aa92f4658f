"""The options a project DataLoader subclass gives torch's DataLoader (twenty-second judge,
FP3: picotron's `MicroBatchDataLoader(DataLoader)`, whose `__init__` builds a
DistributedSampler and passes `sampler=self.sampler, pin_memory=pin_memory` (default True)
to `super().__init__`: the instance call names neither, yet the loader has both)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, keyword, terminal_name

# torch.utils.data.DataLoader's positional parameters after the dataset
_POSITIONAL: tuple[str, ...] = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler")
_POSITIONAL += ("num_workers", "collate_fn", "pin_memory")

Options = dict[str, ast.expr]


def subclass_options(ctx: ModuleContext, loader: ast.Call) -> Options | None:
    """The options (name -> value) torch's DataLoader receives from `loader`, a call of a
    project subclass whose own `__init__` calls `super().__init__(...)` once without
    `*args` / `**kwargs`: each option the super call gives, a parameter of `__init__`
    replaced by what `loader` passes for it or by its default. None when `loader` is not
    such a call (its own keywords are the DataLoader's)."""
    init = _own_init(ctx, loader)
    if init is None or any(isinstance(a, ast.Starred) for a in loader.args):
        return None
    supers = [node for node in ast.walk(init) if _super_init(node)]
    if len(supers) != 1 or not isinstance(supers[0], ast.Call):
        return None
    call = supers[0]
    if any(kw.arg is None for kw in call.keywords) or any(
        isinstance(a, ast.Starred) for a in call.args
    ):
        return None
    args = call.args[1:] if _explicit_self(call) else call.args
    given: Options = dict(zip(_POSITIONAL, args, strict=False))
    given.update({kw.arg: kw.value for kw in call.keywords if kw.arg is not None})
    return {name: _argument(init, loader, value) for name, value in given.items()}


def _own_init(ctx: ModuleContext, loader: ast.Call) -> ast.FunctionDef | None:
    if ctx.project is None:
        return None
    found = ctx.project.class_of_call(ctx, loader)
    if found is None:
        return None
    for statement in found[1].body:
        if isinstance(statement, FUNCTION_TYPES) and statement.name == "__init__":
            return statement if isinstance(statement, ast.FunctionDef) else None
    return None


def _super_init(node: ast.AST) -> bool:
    """`super().__init__(...)`, `super(Cls, self).__init__(...)`, `DataLoader.__init__(self,
    ...)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr != "__init__":
        return False
    owner = node.func.value
    if isinstance(owner, ast.Call) and terminal_name(owner.func) == "super":
        return True
    return terminal_name(owner).endswith("DataLoader")


def _explicit_self(call: ast.Call) -> bool:
    owner = call.func.value if isinstance(call.func, ast.Attribute) else None
    return not (isinstance(owner, ast.Call) and terminal_name(owner.func) == "super")


def _argument(init: ast.FunctionDef, loader: ast.Call, value: ast.expr) -> ast.expr:
    """`value` of the super call, a parameter of `__init__` replaced by the argument the
    instance call gives for it, or by its default; anything else as it is."""
    if not isinstance(value, ast.Name):
        return value
    positional = [a.arg for a in init.args.posonlyargs + init.args.args][1:]
    if value.id not in positional and value.id not in [a.arg for a in init.args.kwonlyargs]:
        return value
    passed = keyword(loader, value.id)
    if passed is not None:
        return passed
    if value.id in positional and positional.index(value.id) < len(loader.args):
        return loader.args[positional.index(value.id)]
    return _default(init, value.id) or value


def _default(init: ast.FunctionDef, name: str) -> ast.expr | None:
    arguments = init.args
    positional = arguments.posonlyargs + arguments.args
    offset = len(positional) - len(arguments.defaults)
    for index, parameter in enumerate(positional):
        if parameter.arg == name and index >= offset:
            return arguments.defaults[index - offset]
    for parameter, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        if parameter.arg == name:
            return default
    return None
