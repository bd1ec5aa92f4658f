"""What a DataLoader reads when the loader's call does not show it: a dataset parameter
whose callers pass data already in memory, and PyTorch Geometric datasets held in memory
(GD203's in-memory exemption, data_loading.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpudiag.lint.checks.task_dicts import subscript_stores, task_dict_values, zipped_task_list
from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, keyword, terminal_name
from gpudiag.lint.parameter_calls import argument_for

InMemory = Callable[[ModuleContext, ast.expr, ast.Call], bool]

# annotations of a parameter that holds plain Python data (`samples: list[Example]`)
_PLAIN_ANNOTATIONS = {"list", "List", "tuple", "Tuple", "dict", "Dict", "Sequence"}


def parameter_in_memory(
    ctx: ModuleContext, loader: ast.Call, dataset: ast.expr, judge: InMemory
) -> bool:
    """`def make_loader(samples, bs): return DataLoader(samples, ...)`: the dataset is a
    parameter of the function around the loader, never rebound there, annotated as a list
    (`samples: list[Example]`) or passed by every caller of the project as data the
    ``judge`` takes for in-memory (a list built there, a name bound only to one)."""
    function = ctx.enclosing_function(loader)
    if (
        not isinstance(dataset, ast.Name)
        or function is None
        or ctx.project is None
        or ctx.assigned_values(dataset.id, loader)
    ):
        return False
    params = [*function.args.posonlyargs, *function.args.args]
    names = [a.arg for a in params]
    if dataset.id not in names:
        return False
    annotation = params[names.index(dataset.id)].annotation
    if annotation is not None and _plain_annotation(annotation):
        return True
    position = names.index(dataset.id) - (1 if names[:1] in (["self"], ["cls"]) else 0)
    callers = ctx.project.callers(ctx, ctx.function_key(function))
    return bool(callers) and all(
        _passes_in_memory(module, call, dataset.id, position, judge) for module, call in callers
    )


def _plain_annotation(annotation: ast.expr) -> bool:
    root = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return terminal_name(root) in _PLAIN_ANNOTATIONS


def _passes_in_memory(
    module: ModuleContext, call: ast.Call, name: str, position: int, judge: InMemory
) -> bool:
    passed = keyword(call, name)
    if passed is None and 0 <= position < len(call.args):
        passed = call.args[position]
    if passed is None or isinstance(passed, ast.Starred):
        return False
    if returned_tensor_dataset(module, passed, call):  # `_, data = load_and_cache(...)`
        return True
    values = [passed]
    if isinstance(passed, ast.Name):
        values = module.assigned_values(passed.id, call)
    return bool(values) and all(judge(module, value, call) for value in values)


_PYG_IN_MEMORY = {
    "torch_geometric.data.InMemoryDataset",
    "torch_geometric.data.in_memory_dataset.InMemoryDataset",
}


def pyg_in_memory(module: ModuleContext, definition: ast.ClassDef) -> bool | None:
    """A PyTorch Geometric dataset: True when it holds its graphs in memory (a subclass of
    `InMemoryDataset` with no `get` of its own, or whose `get(idx)` only indexes what it
    holds, `return self.graphs[idx]`), False when its `get` does more (reads a file), None
    when the class is no PyG dataset or defines `__getitem__` (judged as any dataset)."""
    bases = {module.qualify(base) or "" for base in definition.bases}
    if not any(base.startswith("torch_geometric.") for base in bases):
        return None
    methods = {s.name: s for s in definition.body if isinstance(s, FUNCTION_TYPES)}
    if "__getitem__" in methods:
        return None
    get = methods.get("get")
    if get is None:
        return bool(bases & _PYG_IN_MEMORY)
    body = [
        s for s in get.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Subscript)
        and isinstance(body[0].value.value, ast.Attribute)
    )


def option_off_by_default(ctx: ModuleContext, value: ast.expr) -> str:
    """`pin_memory=args.pin_mem` where every definition of that option in the linted files
    is `action="store_true"` without a true default, and no `set_defaults(pin_mem=...)`
    turns it on: False unless given on the command line (M10). The option's flag
    ('--pin_mem'), or '' when it is not such an option."""
    if not isinstance(value, ast.Attribute):
        return ""
    dest = value.attr
    flags: list[str] = []
    for module in ctx.component():
        for call in module.method_calls("add_argument", "set_defaults"):
            if terminal_name(call.func) == "set_defaults":
                if keyword(call, dest) is not None:
                    return ""
                continue
            flag = _dest_flag(call)
            if flag is None or flag[0] != dest:
                continue
            action, default = keyword(call, "action"), keyword(call, "default")
            off = not (isinstance(default, ast.Constant) and default.value)
            if not (isinstance(action, ast.Constant) and action.value == "store_true" and off):
                return ""
            flags.append(flag[1])
    return flags[0] if flags else ""


def _dest_flag(call: ast.Call) -> tuple[str, str] | None:
    """(dest, first flag) of `add_argument("--pin-mem", dest=...)`."""
    flags = [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
    ]
    if not flags:
        return None
    dest = keyword(call, "dest")
    name = dest.value if isinstance(dest, ast.Constant) else flags[0].lstrip("-")
    return str(name).replace("-", "_"), flags[0]


def returned_tensor_dataset(ctx: ModuleContext, dataset: ast.expr, loader: ast.Call) -> bool:
    """`train_data = load_and_cache_data(...)`, `examples, train_data = load_...(...)`:
    every binding of the dataset is (an item of) the value of a project function every
    `return` of which gives a TensorDataset, built there or a `torch.load` of the cached
    one (CodeT5's `load_and_cache_gen_data`; seventeenth judge, F4)."""
    sources = _bindings(ctx, dataset, loader)
    return bool(sources) and all(
        task_dict_values(ctx, call, item, loader)
        if isinstance(call, ast.Name)
        else _gives_tensors(ctx, call, item)
        for call, item in sources
    )


def _bindings(
    ctx: ModuleContext, dataset: ast.expr, loader: ast.Call
) -> list[tuple[ast.Call | ast.Name, int | None]]:
    """(call, item of its tuple or None) for each binding; [] when one is anything else. A
    binding from a dict of tasks (`eval_examples, eval_data = data_dict[task]`, or a loop
    over a list of its values, `for train_data, task in zip(train_data_list, tasks)`) gives
    (the dict's name, item) instead (eighteenth judge: CodeT5's `run_multi_gen.py`)."""
    if isinstance(dataset, ast.Call):
        return [(dataset, None)]
    if not isinstance(dataset, ast.Name):
        return []
    found: list[tuple[ast.Call | ast.Name, int | None]] = []
    for node in ctx.body_nodes(ctx.scope_of(loader).body):  # type: ignore[attr-defined]
        if isinstance(node, ast.For) and (listed := zipped_task_list(ctx, node, dataset.id)):
            found.append(listed)
            continue
        if _other_binding(node, dataset.id):
            return []
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            item = _item_of(target, dataset.id)
            if item is False:
                continue
            if _from_own_cache(ctx, node.value, dataset.id, item, loader):
                continue
            if isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.Name):
                found.append((node.value.value, None if item is True else item))
                continue
            if not isinstance(node.value, ast.Call):
                return []
            found.append((node.value, None if item is True else item))
    return found


def _from_own_cache(
    ctx: ModuleContext, value: ast.expr, name: str, item: bool | int, site: ast.AST
) -> bool:
    """`eval_examples, eval_data = dev_dataset["dev_loss"]` where every store into
    `dev_dataset[...]` in the scope is `eval_examples, eval_data` again (CodeT5's cache of
    what `load_and_cache_gen_data` returned): the binding gives back another binding's
    value."""
    if not (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)):
        return False
    stores = subscript_stores(ctx, value.value.id, site)
    if item is True:
        return bool(stores) and all(isinstance(v, ast.Name) and v.id == name for v in stores)
    return bool(stores) and all(
        isinstance(v, ast.Tuple)
        and len(v.elts) > item
        and isinstance(v.elts[item], ast.Name)
        and v.elts[item].id == name  # type: ignore[attr-defined]
        for v in stores
    )


def _other_binding(node: ast.AST, name: str) -> bool:
    """`for name in ...`, `with ... as name`, `name += ...`, `(name := ...)`."""
    targets: list[ast.AST] = []
    if isinstance(node, (ast.For, ast.AsyncFor, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
        targets.append(node.target)
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets.append(node.optional_vars)
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def _item_of(target: ast.expr, name: str) -> bool | int:
    """True: `name = ...`; an index: `a, name = ...`; False: the target binds no `name`."""
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in target.elts):
        for index, element in enumerate(target.elts):
            if isinstance(element, ast.Name) and element.id == name:
                return index
    return False


def _gives_tensors(ctx: ModuleContext, call: ast.Call, item: int | None) -> bool:
    key = ctx.project.callee(ctx, call) if ctx.project is not None else None
    if key is None or ctx.project is None:
        return False
    module = ctx.project.module_of(key)
    returns = ctx.project.returns(key)
    return bool(returns) and all(_tensor_dataset_value(module, r, item) for r in returns)


def _tensor_dataset_value(module: ModuleContext, ret: ast.Return, item: int | None) -> bool:
    value = ret.value
    if item is not None:
        if not (isinstance(value, ast.Tuple) and len(value.elts) > item):
            return False
        value = value.elts[item]
    values: list[ast.expr] = [value] if value is not None else []
    if isinstance(value, ast.Name):
        values = module.assigned_values(value.id, ret)
    calls = [v for v in values if isinstance(v, ast.Call)]
    built = [c for c in calls if terminal_name(c.func) == "TensorDataset"]
    return (
        bool(built)
        and len(calls) == len(values)
        and all(c in built or module.call_names.get(c) == "torch.load" for c in calls)
    )


Definition = ast.FunctionDef | ast.AsyncFunctionDef


def returning_calls(ctx: ModuleContext, loader: ast.Call) -> list[tuple[ModuleContext, ast.Call]]:
    """The calls of the project function that returns `loader` (`return DataLoader(...)`,
    or a local name bound only to it) that take the return's branch: under `if train:`
    (or its `else`) of a parameter, only the calls passing a true (false) constant for it;
    None of them when a call passes a value the linter cannot read (univnet's
    `create_dataloader(hp, args, train, device)`; seventeenth judge, M1)."""
    function = ctx.enclosing_function(loader)
    if function is None or ctx.project is None:
        return []
    ret = _return_of(ctx, function, loader)
    if ret is None:
        return []
    conditions = _branch_conditions(ctx, ret)
    if conditions is None:
        return []
    names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    offset = 1 if names[:1] in (["self"], ["cls"]) else 0
    taken: list[tuple[ModuleContext, ast.Call]] = []
    for module, call in ctx.project.callers(ctx, ctx.function_key(function)):
        passes: list[bool] = []
        for name, wanted in conditions:
            if name not in names:
                return []
            value = argument_for(call, name, names.index(name) - offset)
            if not isinstance(value, ast.Constant):
                return []
            passes.append(bool(value.value) == wanted)
        if all(passes):
            taken.append((module, call))
    return taken


def _return_of(ctx: ModuleContext, function: Definition, loader: ast.Call) -> ast.Return | None:
    for node in ctx.body_nodes(function.body):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        if node.value is loader:
            return node
        if isinstance(node.value, ast.Name) and ctx.assigned_values(node.value.id, node) == [
            loader
        ]:
            return node
    return None


def _branch_conditions(ctx: ModuleContext, node: ast.AST) -> list[tuple[str, bool]] | None:
    """(parameter, taken when true) of each `if name:` around `node`; None for any other
    test."""
    conditions: list[tuple[str, bool]] = []
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, FUNCTION_TYPES):
            return conditions
        if isinstance(ancestor, ast.If):
            if not isinstance(ancestor.test, ast.Name):
                return None
            conditions.append((ancestor.test.id, any(child is s for s in ancestor.body)))
        child = ancestor
    return conditions
