"""GD602 family: several backward() on a DDP model before one optimizer step (ddgan's
discriminator: the real loss, the R1 penalty, the fake loss; nineteenth judge, M5). DDP
all-reduces the gradients at each backward, so the step pays that many all-reduces."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext

_DETAIL = ": {0} backward() calls before one optimizer step, each all-reduces the gradients"
_FIX = (
    "DDP all-reduces the gradients at every backward(): run all but the last backward of the "
    "step under `with model.no_sync():`, or add the losses and call backward() once."
)
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)


def several_backwards(ctx: ModuleContext) -> Iterator[Hit]:
    """The first backward of a run of two or more in the straight-line code of a step
    loop's body (also inside `with` blocks) with no optimizer step between them and one
    after them; a branch or inner loop holding a step ends the run, one holding only a
    backward (ddgan's R1 penalty under `if args.lazy_reg is None:`) is not counted."""
    step_functions = [d for name in ctx.step_functions for d in ctx.functions[name]]
    for loop in [*ctx.step_loops, *step_functions]:
        pending: list[ast.Call] = []
        for statement in _straight_line(loop.body):
            calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call)]
            backwards = [c for c in calls if ctx.is_backward(c)]
            steps = [c for c in calls if ctx.is_optimizer_step(c)]
            if isinstance(statement, _BRANCHES):
                if steps:
                    pending = []
                continue  # a backward only some steps run does not count
            if steps:
                if len(pending) >= 2:
                    yield Hit("GD602", pending[0], _DETAIL.format(len(pending)), _FIX)
                    break
                pending = []
            pending += backwards


def _straight_line(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            yield from _straight_line(statement.body)
        else:
            yield statement
