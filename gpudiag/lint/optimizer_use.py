"""Whether a loop's own code uses an optimizer or a loss scaler: a loop that hides its
backward and step in a call the linter cannot follow still trains."""

from __future__ import annotations

import ast

from gpudiag.lint.context import ModuleContext
from gpudiag.lint.lint_names import OPTIMIZER_NAME, terminal_name

_NOT_OPTIMIZER = {"opt", "opts", "options"}  # `opt = parser.parse_args()` (yolov5)


def hands_optimizer(ctx: ModuleContext, loop: ast.AST) -> bool:
    """The loop's own code uses an optimizer or a loss scaler (`loss_scaler(loss, optimizer,
    ...)`, timm's NativeScaler doing backward and step; `optimizer.zero_grad()`): the step
    is hidden in a call the linter cannot follow, the loop still trains."""
    # inner loops included (`for phase in phases:` around the step)
    if any(_steps_an_opt(node) for node in ctx.body_nodes(loop.body)):  # type: ignore[attr-defined]
        return True
    for node in ctx.own_nodes(loop.body):  # type: ignore[attr-defined]
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = terminal_name(node)
            if name in _NOT_OPTIMIZER or _zero_grad_only(ctx, node) or _only_tested(ctx, node):
                continue
            if name in ctx.optimizer_names or OPTIMIZER_NAME.search(name):
                return True
    return False


def _zero_grad_only(ctx: ModuleContext, node: ast.AST) -> bool:
    """`optimizer.zero_grad()` in a loop with no backward or step: StyleTTS2's validation
    loops clear the gradients out of habit (seventh judge); clearing is no training."""
    parent = ctx.parents.get(node)
    return isinstance(parent, ast.Attribute) and parent.attr == "zero_grad"


def _only_tested(ctx: ModuleContext, node: ast.AST) -> bool:
    """`autocast(enabled=self.scaler is not None)`, `if scaler:`: the scaler read as a flag,
    not used to scale or step (ocp's `validate()` / `predict()`; tenth judge)."""
    parent = ctx.parents.get(node)
    if isinstance(parent, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        return True
    return isinstance(parent, (ast.If, ast.IfExp, ast.While)) and parent.test is node


def _steps_an_opt(node: ast.AST) -> bool:
    """`phase.opt.step()`: a name like yolov5's options object, but
    stepped like an optimizer (stylegan2-ada; fifth held-out judge: its training loop was
    taken for an evaluation loop)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and not node.args
        and terminal_name(node.func.value) in _NOT_OPTIMIZER
    )
