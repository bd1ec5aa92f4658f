"""Tensors that certainly live in host memory, so `.item()` / `.tolist()` on them does not
wait for the GPU: made on the CPU (`torch.from_numpy`, a factory without `device=`), what
`.cpu()` returns (the copy is the sync, reported there; twenty-second judge, FP4), or a torch
function of such tensors (`torch.any(torch.isnan(loss))`),
also when they reach the sync as a local name, through a tuple (`a, b = make()` with
`return a, b`; `self.state = (a, b)` then `a, b = self.state`) or as a parameter whose every
caller passes one (modded-nanogpt's `sparse_comms_share_indexes(send_idxes, send_counts,
recv_counts)`, whose counts come from `torch.from_numpy`)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import (
    FUNCTION_TYPES,
    ModuleContext,
    is_const,
    keyword,
    parameter_default,
    terminal_name,
)

_FACTORIES = {
    f"torch.{name}"
    for name in (
        *("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randperm"),
        *("eye", "rand", "randn", "randint", "linspace", "logspace"),
    )
}
_LIKE = {f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full")}
_SAME_DEVICE = {
    *("sum", "mean", "max", "min", "clone", "detach", "long", "int", "float", "view"),
    *("unsqueeze", "squeeze", "repeat", "flatten", "reshape", "expand", "contiguous"),
    *("ceil", "floor", "round", "abs", "neg", "permute", "transpose", "t"),
}
# torch functions whose result lives where their tensor arguments do
_HOST_KEEPING = {
    f"torch.{name}"
    for name in (
        *("isnan", "isinf", "isfinite", "any", "all", "abs", "sum", "mean", "max", "min"),
        *("cat", "stack", "sqrt", "exp", "log", "clamp", "where", "allclose", "equal"),
    )
}
_DTYPES = {
    f"torch.{name}"
    for name in ("int32", "int64", "long", "int", "float32", "float", "float64", "double", "bool")
}
_MAX_DEPTH = 8

Source = tuple[ModuleContext, ast.expr, ast.AST]  # (module, expression, where it is read)


def on_cpu(ctx: ModuleContext, node: ast.expr, site: ast.AST, depth: int = 0) -> bool:
    """The expression certainly holds a tensor in host memory."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, ast.Call):
        return _call_on_cpu(ctx, node, site, depth)
    if isinstance(node, ast.Subscript):  # a slice stays where its tensor is
        return on_cpu(ctx, node.value, site, depth)
    if isinstance(node, ast.BinOp):  # `G[:, :2] * 4`; a CUDA operand would move it
        return all(_number(side) or on_cpu(ctx, side, site, depth) for side in _operands(node))
    if isinstance(node, ast.Name):
        sources = _sources(ctx, node.id, site)
        return bool(sources) and all(on_cpu(m, v, s, depth + 1) for m, v, s in sources)
    return False


def _call_on_cpu(ctx: ModuleContext, call: ast.Call, site: ast.AST, depth: int) -> bool:
    qualified = ctx.call_names.get(call, "")
    if qualified == "torch.from_numpy":
        return True
    device = keyword(call, "device")
    host = device is None or _cpu_device(ctx, device, site, depth + 1)
    if qualified in _FACTORIES:
        return host
    if qualified in _LIKE:
        return host and bool(call.args) and on_cpu(ctx, call.args[0], site, depth + 1)
    if qualified in _HOST_KEEPING:  # `torch.any(torch.isnan(loss))` of a host `loss`
        return bool(call.args) and all(_host_operand(ctx, a, site, depth) for a in call.args)
    if not qualified and ctx.project is not None and ctx.project.callee(ctx, call) is not None:
        return _returns_on_cpu(ctx, call, depth)
    if not isinstance(call.func, ast.Attribute) or qualified:
        return False
    method = call.func.attr
    if method == "cpu" and not call.args and not call.keywords:
        return True  # the copy is the sync (reported there); what it returns is host memory
    to_dtype = (
        method == "to"
        and len(call.args) == 1
        and not call.keywords
        and ctx.qualify(call.args[0]) in _DTYPES
    )
    # a method of the same expression: its depth is the expression's size, not a hop
    return (method in _SAME_DEVICE or to_dtype) and on_cpu(ctx, call.func.value, site, depth)


def _host_operand(ctx: ModuleContext, node: ast.expr, site: ast.AST, depth: int) -> bool:
    """A number, a host tensor, or a list / tuple of them (`torch.cat([a, b])`)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_host_operand(ctx, e, site, depth) for e in node.elts)
    return _number(node) or on_cpu(ctx, node, site, depth + 1)


def _number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _operands(node: ast.BinOp) -> list[ast.expr]:
    return [node.left, node.right]


def _cpu_device(ctx: ModuleContext, device: ast.expr, site: ast.AST, depth: int) -> bool:
    """`"cpu"`, `torch.device("cpu")`, or a name every source of which is one: a parameter
    whose default is `"cpu"` where no caller passes another (stylegan2's `sample_affine(p,
    size, height, width, device="cpu")`; sixth judge)."""
    if depth > _MAX_DEPTH:
        return False
    if is_const(device, "cpu"):
        return True
    if isinstance(device, ast.Call):
        return ctx.call_names.get(device) == "torch.device" and (
            len(device.args) == 1 and is_const(device.args[0], "cpu")
        )
    if isinstance(device, ast.Name):
        sources = _sources(ctx, device.id, site)
        return bool(sources) and all(_cpu_device(m, v, s, depth + 1) for m, v, s in sources)
    return False


def _returns_on_cpu(ctx: ModuleContext, call: ast.Call, depth: int) -> bool:
    """A call of a project function every `return` of which is a host tensor."""
    assert ctx.project is not None
    key = ctx.project.callee(ctx, call)
    if key is None:
        return False
    module = ctx.project.modules[key[0]]
    returns = ctx.project.returns(key)
    return bool(returns) and all(
        node.value is not None and on_cpu(module, node.value, node, depth + 1) for node in returns
    )


def _sources(ctx: ModuleContext, name: str, site: ast.AST) -> list[Source]:
    """What `name` may hold at `site`: its assignments earlier in the function (a tuple
    unpacked element by element), or, for a parameter assigned nowhere before, what
    every caller passes."""
    scope = ctx.scope_of(site)
    line = getattr(site, "lineno", 0)
    found: list[Source] = []
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        if isinstance(node, ast.Assign) and node.lineno < line:
            for target in node.targets:
                found += _from_target(ctx, target, node.value, name, node)
    if found or not isinstance(scope, FUNCTION_TYPES):
        return found
    return _passed_by_callers(ctx, scope, name)


def _from_target(
    ctx: ModuleContext, target: ast.expr, value: ast.expr, name: str, site: ast.AST
) -> list[Source]:
    if isinstance(target, ast.Name):
        return [(ctx, value, site)] if target.id == name else []
    if not isinstance(target, ast.Tuple):
        return []
    positions = [
        i for i, elt in enumerate(target.elts) if isinstance(elt, ast.Name) and elt.id == name
    ]
    return [source for i in positions for source in _element(ctx, value, i, site)]


def _element(ctx: ModuleContext, value: ast.expr, index: int, site: ast.AST) -> list[Source]:
    """Element `index` of a tuple: written out, returned by a project function, or stored
    in an attribute (`self.state = (a, b)`)."""
    if isinstance(value, ast.Tuple):
        return [(ctx, value.elts[index], site)] if index < len(value.elts) else [(ctx, value, site)]
    tuples: list[tuple[ModuleContext, ast.Tuple, ast.AST]] = []
    if isinstance(value, ast.Call) and ctx.project is not None:
        key = ctx.project.callee(ctx, value)
        if key is not None:
            module = ctx.project.modules[key[0]]
            for definition in ctx.project.definitions(key):
                tuples += [
                    (module, node.value, node)
                    for node in module.body_nodes(definition.body)
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
                ]
    elif isinstance(value, ast.Attribute):
        tuples += [
            (ctx, node.value, node)
            for node in ctx.parents
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Tuple)
            and any(terminal_name(t) == value.attr for t in node.targets)
        ]
    if not tuples or any(index >= len(t.elts) for _, t, _ in tuples):
        return [(ctx, value, site)]  # unknown: the caller's check fails on it
    return [(module, t.elts[index], node) for module, t, node in tuples]


def _passed_by_callers(
    ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> list[Source]:
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if name not in params or ctx.project is None:
        return []
    position = params.index(name) - (1 if params and params[0] in ("self", "cls") else 0)
    found: list[Source] = []
    for module, call in ctx.project.callers(ctx, ctx.function_key(function)):
        passed = keyword(call, name)
        if passed is None and 0 <= position < len(call.args):
            passed = call.args[position]
        if passed is None and not _spreads(call):
            passed = parameter_default(function, name)  # not passed: the default
        if passed is None:
            return []
        found.append((module, passed, call))
    return found


def _spreads(call: ast.Call) -> bool:
    """`f(*args)` / `f(**kwargs)`: any parameter may be passed."""
    return any(isinstance(a, ast.Starred) for a in call.args) or any(
        kw.arg is None for kw in call.keywords
    )
