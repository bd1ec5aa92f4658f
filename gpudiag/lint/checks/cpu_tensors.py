"""Tensors that certainly live in host memory, so `.item()` / `.tolist()` on them does not
wait for the GPU: made on the CPU (`torch.from_numpy`, a factory without `device=`; not `.cpu()`, which is
the sync itself),
also when they reach the sync as a local name, through a tuple (`a, b = make()` with
`return a, b`; `self.state = (a, b)` then `a, b = self.state`) or as a parameter whose every
caller passes one (modded-nanogpt's `sparse_comms_share_indexes(send_idxes, send_counts,
recv_counts)`, whose counts come from `torch.from_numpy`)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, keyword, terminal_name

_FACTORIES = {
    f"torch.{name}"
    for name in ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randperm")
}
_LIKE = {f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full")}
_SAME_DEVICE = {"sum", "mean", "max", "min", "clone", "detach", "long", "int", "float", "view"}
_MAX_DEPTH = 8

Source = tuple[ModuleContext, ast.expr, ast.AST]  # (module, expression, where it is read)


def on_cpu(ctx: ModuleContext, node: ast.expr, site: ast.AST, depth: int = 0) -> bool:
    """The expression certainly holds a tensor in host memory."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, ast.Call):
        return _call_on_cpu(ctx, node, site, depth)
    if isinstance(node, ast.Subscript):  # a slice stays where its tensor is
        return on_cpu(ctx, node.value, site, depth + 1)
    if isinstance(node, ast.Name):
        sources = _sources(ctx, node.id, site)
        return bool(sources) and all(on_cpu(m, v, s, depth + 1) for m, v, s in sources)
    return False


def _call_on_cpu(ctx: ModuleContext, call: ast.Call, site: ast.AST, depth: int) -> bool:
    qualified = ctx.call_names.get(call, "")
    if qualified == "torch.from_numpy":
        return True
    if qualified in _FACTORIES:
        return keyword(call, "device") is None
    if qualified in _LIKE:
        return (
            keyword(call, "device") is None
            and bool(call.args)
            and on_cpu(ctx, call.args[0], site, depth + 1)
        )
    if not isinstance(call.func, ast.Attribute) or qualified:
        return False
    return call.func.attr in _SAME_DEVICE and on_cpu(ctx, call.func.value, site, depth + 1)


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
        if passed is None:
            return []
        found.append((module, passed, call))
    return found
