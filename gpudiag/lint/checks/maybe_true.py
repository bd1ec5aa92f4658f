"""A keyword whose value may be True on some runs: `find_unused_parameters=(not getattr(
model.config, "gradient_checkpointing", False) if isinstance(model, PreTrainedModel) else
True)` (SimCSE's copy of the Hugging Face Trainer; twentieth judge, M2) or `=not grad_ckpt`
(fifteenth judge, L)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import is_const


def when_true(value: ast.expr | None) -> str | None:
    """None when `value` is not known to be True on any run; '' when it is the constant
    True; otherwise the condition under which it is True, in words (`unless
    getattr(model.config, 'gradient_checkpointing', False)`). Only the constant `True`, a
    conditional expression with such a branch and `not <name, attribute or call>` count:
    a plain variable (`find_unused_parameters=args.unused`) is the user's choice."""
    if value is None:
        return None
    if is_const(value, True):
        return ""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
        if isinstance(value.operand, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            return f"unless {ast.unparse(value.operand)}"
        return None
    if isinstance(value, ast.IfExp):
        body, orelse = when_true(value.body), when_true(value.orelse)
        if body == "" and orelse == "":
            return ""
        if body is None and orelse is None:
            return None
        test = ast.unparse(value.test)
        branches = ((body, f"if {test}"), (orelse, "otherwise"))
        return "; ".join(f"{b or 'always'} {where}" for b, where in branches if b is not None)
    return None


def conditional_detail(condition: str) -> str:
    """The finding's detail for a value True only on some runs ('' for the constant)."""
    if not condition:
        return ""
    return (
        f": find_unused_parameters is conditional, True {condition}; where it is True"
        " the traversal runs every iteration"
    )
