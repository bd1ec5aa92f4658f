"""GD301 on the synchronize of a CUDA-event timer (msn's `gpu_timer`: `torch.cuda.Event(
enable_timing=True)`, `start.elapsed_time(end)`; nineteenth judge, F4): a real per-step
stall, but the measurement itself; the metrics advice does not fit, a timing one does."""

from __future__ import annotations

import ast

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, terminal_name

_TIMER_DETAIL = ": torch.cuda.synchronize() of a CUDA-event timer"
_TIMER_FIX = (
    "The timer waits for the GPU to read elapsed_time every step: time every N steps "
    "(or behind an off-by-default switch), or record the events and read "
    "start.elapsed_time(end) later, after end.synchronize() at a logging step; "
    "torch.profiler measures without stalling each step."
)


def synchronize_hit(ctx: ModuleContext, call: ast.Call) -> Hit:
    """GD301 on `torch.cuda.synchronize()`, with the timing fix in a CUDA-event timer."""
    function = next((a for a in ctx.ancestors(call) if isinstance(a, FUNCTION_TYPES)), None)
    scope = function if function is not None else ctx.tree
    if any(_times_events(ctx, node) for node in ast.walk(scope)):
        return Hit("GD301", call, _TIMER_DETAIL, _TIMER_FIX)
    return Hit("GD301", call, ": torch.cuda.synchronize()")


def _times_events(ctx: ModuleContext, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr == "elapsed_time":
        return True
    return terminal_name(node.func) == "Event" and ctx.call_names.get(node, "").startswith(
        "torch.cuda."
    )
