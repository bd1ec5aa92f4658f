"""A DataLoader over a tensor that is already on the GPU (eighteenth judge, F3:
NBFNet-PyG's `DataLoader(torch.cat([data.target_edge_index, ...]).t(), bs, sampler=...)`
where every caller passes `data` after `data = data.to(device)`): forked workers cannot use
CUDA tensors and `pin_memory=True` raises on them, so neither GD203 nor GD204 applies."""

from __future__ import annotations

import ast

from gpudiag.lint.checks.host_iterators import reaching_value
from gpudiag.lint.context import ModuleContext, keyword
from gpudiag.lint.device_moves import moves_to_gpu
from gpudiag.lint.parameter_calls import every_caller_passes

_MAX_DEPTH = 10
# tensor methods and torch functions that keep their input's device
_KEEPING = {
    *("t", "T", "unsqueeze", "squeeze", "view", "reshape", "permute", "transpose", "flip"),
    *("long", "float", "int", "contiguous", "clone", "detach", "flatten", "repeat"),
    *("half", "bfloat16", "double", "bool", "byte"),
    *("cat", "stack", "hstack", "vstack", "concat", "column_stack"),
}


def device_tensor_dataset(ctx: ModuleContext, dataset: ast.expr) -> bool:
    return _on_device(ctx, dataset, 0)


def _on_device(ctx: ModuleContext, value: ast.expr, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, (ast.List, ast.Tuple)):
        return bool(value.elts) and all(_on_device(ctx, e, depth + 1) for e in value.elts)
    if isinstance(value, ast.Call):
        qualified = ctx.call_names.get(value) or ""
        if moves_to_gpu(value, qualified):
            return True
        if qualified.startswith("torch.") and qualified.count(".") == 1:
            name = qualified.split(".")[1]
            if keyword(value, "device") is not None:
                return False  # made on the device given, not the GPU (moves_to_gpu)
            return (
                name in _KEEPING and bool(value.args) and _on_device(ctx, value.args[0], depth + 1)
            )
        if isinstance(value.func, ast.Attribute) and value.func.attr in _KEEPING:
            return _on_device(ctx, value.func.value, depth + 1)
        return False
    if isinstance(value, ast.Attribute):
        if value.attr in _KEEPING:  # `x.T`
            return _on_device(ctx, value.value, depth + 1)
        root = value.value
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and _on_device(ctx, root, depth + 1)
    if isinstance(value, ast.Subscript):
        return _on_device(ctx, value.value, depth + 1)
    if isinstance(value, ast.Name):
        found = reaching_value(ctx, value)
        if found is not None:
            return _on_device(ctx, found[0], depth + 1)
        return _parameter_on_device(ctx, value, depth)
    return False


def _parameter_on_device(ctx: ModuleContext, name: ast.Name, depth: int) -> bool:
    """A parameter, not rebound before the read, that every call of its function in the
    component passes a value moved to the GPU (`train_data = train_data.to(device)`)."""
    function = ctx.enclosing_function(name)
    if function is None or ctx.project is None or ctx.assigned_values(name.id, name):
        return False
    return every_caller_passes(
        ctx, function, name.id, lambda module, passed: _on_device(module, passed, depth + 1)
    )
