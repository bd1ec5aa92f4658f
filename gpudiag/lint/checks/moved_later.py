"""A value the step moves to the GPU later is host memory before the move (eighteenth
judge, F2: XLM's `assert pred_mask.sum().item() == y.size(0)` right before `x, ..., pred_mask,
y = to_cuda(...)`; `truncate(x, lengths, ...)` / `concat_batches(...)` reading the lengths
of a batch whose results `to_cuda(...)` moves afterwards).

From the read, the statements that follow in the same straight-line code (the rest of the
block, then what follows the blocks around it, up to the end of a loop body or function)
are followed: the name is moved when a later statement passes it to a move (`to_cuda(...)`,
`x.cuda()`, `x.to(device)`: `device_moves.moves_to_gpu`); a statement binding names from a call
the name is passed to (`x, lengths = truncate(x, lengths, ...)`) hands the question on to
those names (a helper keeps its input's device unless it moves it; moved results mean host
input); any other rebinding of the name ends the search (not moved).
"""

from __future__ import annotations

import ast

from gpudiag.lint.context import FUNCTION_TYPES, LOOP_TYPES, ModuleContext
from gpudiag.lint.device_moves import moves_to_gpu

_MAX_STATEMENTS = 200


def moved_later(ctx: ModuleContext, name: ast.Name) -> bool:
    statement: ast.AST = name
    while not isinstance(statement, ast.stmt):
        parent = ctx.parents.get(statement)
        if parent is None:
            return False
        statement = parent
    return _moved_from(ctx, statement, {name.id}, 0)


def _moved_from(
    ctx: ModuleContext, statement: ast.AST, tracked: set[str], depth: int, skip: int = 0
) -> bool:
    for following in _following(ctx, statement)[skip:]:
        if isinstance(following, ast.Return):
            return depth < 2 and _moved_by_callers(ctx, following, tracked, depth)
        moved, tracked = _step(ctx, following, tracked)
        if moved:
            return True
        if not tracked:
            return False
    return False


def _moved_by_callers(ctx: ModuleContext, ret: ast.Return, tracked: set[str], depth: int) -> bool:
    """`return x, lengths, positions, langs` of a helper (XLM's `generate_batch`): every call
    of it in the component binds the returned names to targets that it moves later."""
    value = ret.value
    items = value.elts if isinstance(value, ast.Tuple) else [value]
    places = [
        i for i, item in enumerate(items) if isinstance(item, ast.Name) and item.id in tracked
    ]
    function = ctx.enclosing_function(ret)
    if not places or function is None or ctx.project is None:
        return False
    callers = ctx.project.callers(ctx, ctx.function_key(function))
    for module, call in callers:
        assign = module.parents.get(call)
        if not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
            return False
        target = assign.targets[0]
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names = {
            elements[i].id  # type: ignore[attr-defined]
            for i in places
            if i < len(elements) and isinstance(elements[i], ast.Name)
        }
        if len(elements) != len(items) or not names:
            return False
        if not _moved_from(module, assign, names, depth + 1, skip=1):
            return False
    return bool(callers)


def _following(ctx: ModuleContext, statement: ast.AST) -> list[ast.stmt]:
    """The statement, then those after it in straight-line code, up to the end of the loop
    body or function it is in."""
    found: list[ast.stmt] = []
    current = statement
    while len(found) < _MAX_STATEMENTS:
        parent = ctx.parents.get(current)
        if parent is None or isinstance(parent, (ast.ClassDef, ast.Lambda)):
            break
        block = next(
            (
                b
                for field in ("body", "orelse", "finalbody", "handlers")
                if isinstance(b := getattr(parent, field, None), list)
                and any(s is current for s in b)
            ),
            None,
        )
        if block is not None:
            start = next(i for i, s in enumerate(block) if s is current)
            found += [s for s in block[start + (0 if current is statement else 1) :]]
        if isinstance(parent, (*LOOP_TYPES, *FUNCTION_TYPES, ast.Module)):
            break
        current = parent
    return found


def _step(ctx: ModuleContext, statement: ast.stmt, tracked: set[str]) -> tuple[bool, set[str]]:
    if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
        call = statement.value
        passed = _passed_names(call)
        if passed & tracked:
            if moves_to_gpu(call, ctx.call_names.get(call)):
                return True, tracked
            targets = {
                n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)
            }
            return False, (tracked - targets) | targets
    rebound = {
        n.id
        for n in ast.walk(statement)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in tracked
    }
    return False, tracked - rebound


def _passed_names(call: ast.Call) -> set[str]:
    values = [*call.args, *(kw.value for kw in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        values.append(call.func.value)
    names = {v.id for v in values if isinstance(v, ast.Name)}
    return names | {
        v.value.id for v in values if isinstance(v, ast.Starred) and isinstance(v.value, ast.Name)
    }
