"""A memory release under a switch named for it (twenty-first judge, D4): Pointcept's
`if self.cfg.empty_cache: torch.cuda.empty_cache()` (`empty_cache = False` in its base
config). A switch of that name, off unless the user turns it on for a run that runs out of
memory, is an opt-in like a `store_true` option: GD302 is not reported under it. Only an
`if` without `else` whose test, or one operand of its `and`, is a name or attribute that
says cache (`cfg.empty_cache`, `args.clear_cache`, `self.free_cache`) counts."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.context import ModuleContext

_CACHE_SWITCH = re.compile(r"cache", re.I)


def under_cache_switch(ctx: ModuleContext, node: ast.AST) -> bool:
    return any(any(_switch_name(t) for t in tests) for _, tests in switch_ifs(ctx, node))


def switch_ifs(ctx: ModuleContext, node: ast.AST) -> Iterator[tuple[ast.If, list[ast.expr]]]:
    """Each `if` without `else` whose body holds `node`, with its test's operands (those of
    an `and`, else the test alone): the switches that may have turned `node` on."""
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, ast.If) and child in ancestor.body and not ancestor.orelse:
            test = ancestor.test
            both = isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)
            yield ancestor, (list(test.values) if both else [test])  # type: ignore[attr-defined]
        child = ancestor


def _switch_name(test: ast.expr) -> bool:
    if isinstance(test, ast.Attribute):
        return bool(_CACHE_SWITCH.search(test.attr))
    return isinstance(test, ast.Name) and bool(_CACHE_SWITCH.search(test.id))
