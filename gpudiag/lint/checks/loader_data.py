"""What a DataLoader reads when the loader's call does not show it: a dataset parameter
whose callers pass data already in memory, and PyTorch Geometric datasets held in memory
(GD203's in-memory exemption, data_loading.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext, keyword, terminal_name

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
