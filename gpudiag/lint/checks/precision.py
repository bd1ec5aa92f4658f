"""GD601, GD602: mixed precision and gradient accumulation under DDP."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext, names_in

_REDUCED_PRECISION = {
    "autocast",
    "GradScaler",
    "half",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "mixed_precision",  # Accelerator(mixed_precision="bf16"), FSDP MixedPrecision
    "MixedPrecision",
    "fp16",
    "bf16",
    "amp",
    "use_amp",
}
_ACCUMULATION = re.compile(r"accum", re.I)
_SKIPS_SYNC = {"no_sync", "require_backward_grad_sync", "accumulate"}


def check(ctx: ModuleContext) -> Iterator[Hit]:
    backwards = [call for call in ctx.calls if ctx.is_backward(call) and ctx.in_step_loop(call)]
    if ctx.gpu_job and backwards and not _uses_reduced_precision(ctx):
        yield Hit("GD601", backwards[0])
    # no_sync(), nanoGPT's `model.require_backward_grad_sync = last_micro_step`, or
    # accelerate's `with accelerator.accumulate(model):` (no_sync on the non-final micro-steps)
    component = ctx.component()
    if any(m.ddp_code for m in component) and all(
        m.identifiers.isdisjoint(_SKIPS_SYNC) for m in component
    ):
        yield from _accumulation_without_no_sync(ctx)


def _uses_reduced_precision(ctx: ModuleContext) -> bool:
    """In the file or the files of its job (an FSDP MixedPrecision policy in policies/,
    autocast in the train() helper of utils.py), not in another script that only shares a
    helper module with this one (an fp32 evaluation script next to an AMP trainer)."""
    return any(not _REDUCED_PRECISION.isdisjoint(m.identifiers) for m in ctx.related())


def _accumulation_without_no_sync(ctx: ModuleContext) -> Iterator[Hit]:
    """backward() every iteration, optimizer.step() only under `if (i + 1) % accum == 0`."""
    step_functions = [d for name in ctx.step_functions for d in ctx.functions[name]]
    for loop in [*ctx.step_loops, *step_functions]:
        calls = [node for node in ctx.own_nodes(loop.body) if isinstance(node, ast.Call)]
        unguarded_backward = [
            c for c in calls if ctx.is_backward(c) and not _accumulation_guard(ctx, c, loop)
        ]
        guarded_steps = [
            c for c in calls if ctx.is_optimizer_step(c) and _accumulation_guard(ctx, c, loop)
        ]
        if unguarded_backward and guarded_steps:
            yield Hit("GD602", unguarded_backward[0])
        elif scaled := [c for c in calls if _steps_every_nth_call(c)]:
            yield Hit("GD602", scaled[0])


_UPDATE_KEYWORD = re.compile(r"update|step|sync|accum", re.I)


def _steps_every_nth_call(call: ast.Call) -> bool:
    """`loss_scaler(loss, optimizer, update_grad=(it + 1) % update_freq == 0)`: a helper that
    runs backward every call and the optimizer step only on every n-th (DeiT / ConvNeXt /
    MAE's NativeScaler)."""
    return any(
        kw.arg is not None
        and _UPDATE_KEYWORD.search(kw.arg)
        and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(kw.value))
        for kw in call.keywords
    )


def _accumulation_guard(ctx: ModuleContext, node: ast.AST, loop: ast.AST) -> bool:
    for ancestor in ctx.ancestors(node):
        if ancestor is loop or isinstance(ancestor, ast.FunctionDef):
            return False
        if isinstance(ancestor, ast.If):
            test = ancestor.test
            has_mod = any(
                isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test)
            )
            if has_mod or any(_ACCUMULATION.search(name) for name in names_in(test)):
                return True
    return False
