"""Values that decide the learning rate written into `optimizer.param_groups`: every rank
must step with the same one, so a collective or a host read that makes them agree is
required for correctness, not avoidable per-step overhead (rsl_rl's KL-adaptive lr:
`kl_mean = kl.mean(); all_reduce(kl_mean); kl_mean /= world; if kl_mean > 2 * desired_kl:
lr = max(1e-5, lr / 1.5)`, then `for g in optimizer.param_groups: g["lr"] = lr`). GD301 and
GD704 do not report them."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, is_const, terminal_name

_MAX_ROUNDS = 8


def decides_lr(ctx: ModuleContext, node: ast.AST, value: ast.AST) -> bool:
    """`value` (the tensor a collective reduces, a `.item()`'s receiver, a tested tensor) at
    `node` feeds, in the function around `node`, a learning rate written into
    `param_groups`: directly, through the names assigned from it, or as the test of an `if`
    that assigns one of them."""
    function = ctx.enclosing_function(node)
    if function is None:
        return False
    return bool(_lr_inputs(ctx, function) & set(value_names(ctx, value)))


def _lr_inputs(ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    nodes = list(ctx.body_nodes(function.body))
    inputs = {
        name
        for node in nodes
        if _writes_lr(node)
        for name in value_names(ctx, node.value)  # type: ignore[attr-defined]
    }
    if not inputs:
        return inputs
    assignments = [n for n in nodes if isinstance(n, (ast.Assign, ast.AugAssign))]
    for _ in range(_MAX_ROUNDS):
        before = len(inputs)
        for node in assignments:
            if _target_names(node) & inputs:
                inputs |= set(value_names(ctx, node.value))
                inputs |= {name for test in _tests_around(ctx, node, function) for name in test}
        if len(inputs) == before:
            break
    return inputs


def _writes_lr(node: ast.AST) -> bool:
    """`param_group["lr"] = value` (a subscript by the key "lr")."""
    return isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Subscript) and is_const(target.slice, "lr")
        for target in node.targets
    )


def _target_names(node: ast.Assign | ast.AugAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names: set[str] = set()
    for target in targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names |= {terminal_name(e) for e in elements if isinstance(e, (ast.Name, ast.Attribute))}
    return names - {""}


def _tests_around(ctx: ModuleContext, node: ast.AST, function: ast.AST) -> Iterator[list[str]]:
    """The names tested by the `if`s around `node` inside `function`."""
    for ancestor in ctx.ancestors(node):
        if ancestor is function or isinstance(ancestor, FUNCTION_TYPES):
            return
        if isinstance(ancestor, ast.If):
            yield list(value_names(ctx, ancestor.test))


def value_names(ctx: ModuleContext, node: ast.AST) -> Iterator[str]:
    """The variables and attributes an expression reads, not the functions it calls
    (`torch.mean(kl)` reads `kl`; `kl.mean()` reads `kl`), nor `self`."""
    pending: list[ast.AST] = [node]
    while pending:
        sub = pending.pop()
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Attribute) and sub not in ctx.call_names:
                pending.append(sub.func.value)
            pending.extend(sub.args)
            pending.extend(k.value for k in sub.keywords)
        elif isinstance(sub, ast.Name):
            if sub.id != "self":
                yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
            pending.append(sub.value)
        else:
            pending.extend(ast.iter_child_nodes(sub))
