"""GD201-GD207: DataLoader and DistributedSampler use."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import (
    DATALOADER,
    DIST_SAMPLER,
    ModuleContext,
    has_star_kwargs,
    is_const,
    keyword,
    names_in,
    terminal_name,
)

_LOADER_NAME = re.compile(r"loader|(^|_)dl($|_)", re.I)
_EVAL_NAME = re.compile(r"val|test|eval|dev(_|$)", re.I)
_TORCH_DTYPE = re.compile(r"^torch\.(u?int\d*|float\d*|bfloat16|half|double|long|bool|complex\d*)$")


def check(ctx: ModuleContext) -> Iterator[Hit]:
    loaders = ctx.calls_to(DATALOADER)
    for loader in loaders:
        yield from _check_loader(ctx, loader)
    for sampler in ctx.calls_to(DIST_SAMPLER):
        yield from _check_sampler(ctx, sampler)
    pinned = [loader for loader in loaders if is_const(keyword(loader, "pin_memory"), True)]
    if pinned:
        yield from _blocking_batch_copies(ctx, pinned, all_pinned=len(pinned) == len(loaders))


def _assigned_name(ctx: ModuleContext, call: ast.Call) -> str:
    parent = ctx.parents.get(call)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return terminal_name(parent.targets[0])
    return ""


def _check_loader(ctx: ModuleContext, loader: ast.Call) -> Iterator[Hit]:
    unknown_kwargs = has_star_kwargs(loader)
    sampler = keyword(loader, "sampler") or keyword(loader, "batch_sampler")
    if len(loader.args) >= 4:  # DataLoader(dataset, batch_size, shuffle, sampler, ...)
        sampler = loader.args[3]
    is_eval = bool(_EVAL_NAME.search(_assigned_name(ctx, loader)))
    needs_sampler = ctx.ddp_code and sampler is None and not unknown_kwargs and not is_eval
    if needs_sampler and not _is_iterable_dataset(ctx, loader) and not _prepared(ctx, loader):
        yield Hit("GD201", loader)
    if (
        sampler is not None
        and not is_const(sampler, None)
        and is_const(keyword(loader, "shuffle"), True)
    ):
        yield Hit("GD206", loader)
    if not ctx.gpu_job or unknown_kwargs:
        return
    workers = keyword(loader, "num_workers")
    if (workers is None and len(loader.args) < 6) or is_const(workers, 0):
        yield Hit("GD203", loader)
    pin = keyword(loader, "pin_memory")
    if (pin is None and len(loader.args) < 8) or is_const(pin, False):
        yield Hit("GD204", loader)


# Frameworks that replace the loader's sampler with a DistributedSampler:
# Fabric's setup_dataloaders, Accelerate's prepare / prepare_data_loader.
_PREPARES = {"setup_dataloaders", "setup_dataloader", "prepare", "prepare_data_loader"}


def _prepared(ctx: ModuleContext, loader: ast.Call) -> bool:
    """The loader is handed to fabric.setup_dataloaders(...) / accelerator.prepare(...)."""
    parent = ctx.parents.get(loader)
    if isinstance(parent, ast.Call) and terminal_name(parent.func) in _PREPARES:
        return True
    name = _assigned_name(ctx, loader)
    return bool(name) and any(
        name in {terminal_name(arg) for arg in call.args}
        for method in _PREPARES
        for call in ctx.method_calls(method)
    )


def _check_sampler(ctx: ModuleContext, sampler: ast.Call) -> Iterator[Hit]:
    rank = keyword(sampler, "rank")
    replicas = keyword(sampler, "num_replicas")
    if (isinstance(rank, ast.Constant) and isinstance(rank.value, int)) or is_const(replicas, 1):
        yield Hit("GD207", sampler)
    if is_const(keyword(sampler, "shuffle"), False) or _is_eval_sampler(ctx, sampler):
        return
    # set_epoch may be called in another file of the run (a train() helper in utils.py)
    if not any(
        _runs_repeatedly(module, call)
        for module in ctx.component()
        for call in module.method_calls("set_epoch")
    ):
        yield Hit("GD202", sampler)


def _is_eval_sampler(ctx: ModuleContext, sampler: ast.Call) -> bool:
    """A sampler for evaluation data (its order does not matter): named `val_sampler`,
    built on `val_dataset` / `test_set`, or given to a loader named like evaluation."""
    dataset = sampler.args[0] if sampler.args else keyword(sampler, "dataset")
    name = _assigned_name(ctx, sampler)
    if _EVAL_NAME.search(name) or (dataset is not None and _names_eval_data(dataset)):
        return True
    if not name:
        parent = ctx.parents.get(sampler)
        loader = ctx.parents.get(parent) if isinstance(parent, ast.keyword) else None
        return isinstance(loader, ast.Call) and bool(_EVAL_NAME.search(_assigned_name(ctx, loader)))
    users = [
        loader
        for loader in ctx.calls_to(DATALOADER)
        if any(terminal_name(kw.value) == name for kw in loader.keywords if kw.arg == "sampler")
    ]
    return bool(users) and all(_EVAL_NAME.search(_assigned_name(ctx, u)) for u in users)


def _names_eval_data(dataset: ast.expr) -> bool:
    name = terminal_name(dataset)
    if isinstance(dataset, ast.Subscript):  # datasets["validation"]
        key = dataset.slice
        name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    return bool(name) and bool(_EVAL_NAME.search(name))


def _runs_repeatedly(ctx: ModuleContext, call: ast.Call) -> bool:
    """set_epoch inside a loop, or in a function (called once per epoch)."""
    return any(
        isinstance(a, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef))
        for a in ctx.ancestors(call)
    )


def _is_iterable_dataset(ctx: ModuleContext, loader: ast.Call) -> bool:
    """The dataset is an instance of a class of this file that derives from IterableDataset
    (it shards itself: a sampler does not apply)."""
    dataset = loader.args[0] if loader.args else keyword(loader, "dataset")
    if isinstance(dataset, ast.Name):
        for node in ctx.body_nodes(ctx.scope_of(loader).body):  # type: ignore[attr-defined]
            if isinstance(node, ast.Assign) and dataset.id in {
                terminal_name(t) for t in node.targets
            }:
                dataset = node.value
                break
    if not isinstance(dataset, ast.Call):
        return False
    class_name = terminal_name(dataset.func)
    return any(
        isinstance(node, ast.ClassDef)
        and node.name == class_name
        and any("IterableDataset" in ast.unparse(base) for base in node.bases)
        for node in ctx.tree.body
    )


def _loader_names(ctx: ModuleContext, loop: ast.AST) -> set[str]:
    """Names a step loop iterates; `it = iter(loader)` followed by next(it) resolves to loader."""
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        sources: list[ast.AST] = [loop.iter]
    elif isinstance(loop, ast.While):
        sources = [
            n
            for n in ctx.own_nodes(loop.body)
            if isinstance(n, ast.Call) and terminal_name(n.func) == "next"
        ]
    else:
        return set()
    names = {name for source in sources for name in names_in(source)}
    for node in ctx.body_nodes(ctx.scope_of(loop).body):  # type: ignore[attr-defined]
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and terminal_name(node.value.func) == "iter"
            and names & {terminal_name(t) for t in node.targets}
        ):
            names.update(names_in(node.value))
    return names


def _blocking_batch_copies(
    ctx: ModuleContext, pinned: list[ast.Call], all_pinned: bool
) -> Iterator[Hit]:
    pinned_names = {_assigned_name(ctx, loader) for loader in pinned} - {""}
    for loop in ctx.step_loops:
        iterated = _loader_names(ctx, loop)
        loader_like = any(_LOADER_NAME.search(name) for name in iterated)
        if not (iterated & pinned_names or (all_pinned and loader_like)):
            continue
        batch_names = _loop_bound_names(ctx, loop)
        if not batch_names:
            continue
        for node in ctx.body_nodes(loop.body):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("to", "cuda") or not _is_batch(node.func.value, batch_names):
                continue
            if node.func.attr == "to" and not node.args and keyword(node, "device") is None:
                continue
            if node.args and _TORCH_DTYPE.match(ctx.qualify(node.args[0]) or ""):
                continue
            if keyword(node, "non_blocking") is None:
                yield Hit("GD205", node)


def _loop_bound_names(ctx: ModuleContext, loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    names: set[str] = set()
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        names.update(n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name))
    for node in ctx.body_nodes(loop.body):  # batch = next(it)
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and terminal_name(node.value.func) == "next"
        ):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    for node in ctx.body_nodes(loop.body):  # [t.to(device) for t in batch]
        if isinstance(node, ast.comprehension) and _is_batch(node.iter, names):
            names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    return names


def _is_batch(node: ast.AST, batch_names: set[str]) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id in batch_names
