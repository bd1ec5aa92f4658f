"""GD301, GD302, GD303: host synchronisation inside the step loop (GPU jobs only); GD303
when the loop only evaluates (no backward to stall, a smaller cost)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpudiag.lint.checks import Hit
from gpudiag.lint.checks.cpu_tensors import on_cpu
from gpudiag.lint.context import ModuleContext, keyword, names_in, terminal_name

_SYNC_METHODS = ("item", "cpu", "numpy", "tolist")


def check(ctx: ModuleContext) -> Iterator[Hit]:
    if not ctx.gpu_job:
        return
    tensor_names = _tensor_names(ctx)
    yield from _tensor_tests(ctx, tensor_names)
    flags = _opt_in_flags(ctx)
    for call in ctx.calls:
        if not ctx.in_step_loop(call) or ctx.periodic_guard(call) or _under_flag(ctx, call, flags):
            continue
        for hit in _syncs(ctx, call, tensor_names):
            if hit.code == "GD301" and ctx.in_eval_loop_only(call):
                yield Hit("GD303", hit.node, hit.detail)
            else:
                yield hit


def _syncs(ctx: ModuleContext, call: ast.Call, tensor_names: set[str]) -> Iterator[Hit]:
    qualified = ctx.call_names.get(call)
    if qualified == "torch.cuda.empty_cache":
        yield Hit("GD302", call)
    elif qualified == "torch.cuda.synchronize":
        yield Hit("GD301", call, ": torch.cuda.synchronize()")
    elif (
        _is_sync_method(call)
        and not _inside_sync_method(ctx, call)
        and not _on_cpu_batch(ctx, call.func.value)  # type: ignore[attr-defined]
        and not on_cpu(ctx, call.func.value, call)  # type: ignore[attr-defined]
        and not _converts_host_arguments(ctx, call)
    ):
        yield Hit("GD301", call, f": .{call.func.attr}()")  # type: ignore[attr-defined]
    elif isinstance(call.func, ast.Name) and call.func.id == "print":
        printed = sorted({n for arg in call.args for n in names_in(arg)} & tensor_names)
        if printed and not _only_in_sync_calls(call, printed[0]):
            yield Hit("GD301", call, f": print({printed[0]}) formats a tensor")


def _is_sync_method(call: ast.Call) -> bool:
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr in _SYNC_METHODS
        and not call.args
        and not call.keywords
    )


def _inside_sync_method(ctx: ModuleContext, call: ast.Call) -> bool:
    """`x.cpu().numpy()`: report the outer call only."""
    parent = ctx.parents.get(call)
    grand = ctx.parents.get(parent) if parent else None
    return (
        isinstance(parent, ast.Attribute) and isinstance(grand, ast.Call) and _is_sync_method(grand)
    )


def _tensor_names(ctx: ModuleContext) -> set[str]:
    """Names that certainly hold tensors in per-step code: what backward() is called on."""
    names = set()
    for call in ctx.calls:
        if ctx.is_backward(call) and isinstance(call.func, ast.Attribute):
            name = terminal_name(call.func.value)
            if name:
                names.add(name)
    return names


def _only_in_sync_calls(call: ast.Call, name: str) -> bool:
    """print(loss.item()) is reported as .item(), not twice."""
    for node in ast.walk(call):
        if (
            isinstance(node, ast.Call)
            and _is_sync_method(node)
            and name in set(names_in(node.func))
        ):
            return True
    return False


def _on_cpu_batch(ctx: ModuleContext, receiver: ast.AST) -> bool:
    """`labels.numpy()` on a batch straight from the DataLoader (bound by the loop target and
    never moved to the device in the loop) reads host memory: no device sync."""
    while isinstance(receiver, ast.Subscript):
        receiver = receiver.value
    if not isinstance(receiver, ast.Name):
        return False
    child: ast.AST = receiver  # a loop whose `iter` holds the receiver does not bind it
    loops: list[ast.For | ast.AsyncFor] = []
    for ancestor in ctx.ancestors(receiver):
        if isinstance(ancestor, (ast.For, ast.AsyncFor)) and child is not ancestor.iter:
            loops.append(ancestor)
        child = ancestor
    if not loops:
        return False
    loop = loops[0]
    if not ctx.iterates_loader(loop):
        # `for caption, img_id in zip(captions, image_id):` inside the DataLoader loop:
        # an element of a batch field is host memory too
        sources: list[ast.expr] = [loop.iter]
        if isinstance(loop.iter, ast.Call) and terminal_name(loop.iter.func) in (
            "zip",
            "enumerate",
        ):
            sources = list(loop.iter.args)
        return (
            len(loops) > 1
            and receiver.id in {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            and any(isinstance(arg, ast.Name) and _on_cpu_batch(ctx, arg) for arg in sources)
        )
    bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    if receiver.id not in bound:
        return False
    for node in ctx.body_nodes(loop.body):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(n, ast.Name) and n.id == receiver.id
                for t in targets
                for n in ast.walk(t)
            ):
                return False
    return True


_HOST_FUNCTIONS = {"float", "int", "round", "len", "bool", "str", "max", "min", "sum"}
_HOST_METHODS = {"item", "tolist", "get_last_lr", "get_lr"}
_CONFIG_ROOTS = {"args", "cfg", "config", "opt", "opts", "hparams"}


def _converts_host_arguments(ctx: ModuleContext, call: ast.Call) -> bool:
    """`if isinstance(v, torch.Tensor): v = v.item()` in a helper (a metric logger's
    `update(**kwargs)`) whose per-step callers all pass host numbers (`loss_value` from
    `loss.item()`, `lr=optimizer.param_groups[0]["lr"]`): the sync is at the call site."""
    function = ctx.enclosing_function(call)
    if function is None or ctx.project is None or not _under_tensor_check(ctx, call):
        return False
    callers = [
        (module, site)
        for module, site in ctx.project.callers(ctx, ctx.function_key(function))
        if module.in_step_loop(site) and not module.periodic_guard(site)
    ]
    return bool(callers) and all(
        _host_value(module, value, site)
        for module, site in callers
        for value in [*site.args, *(kw.value for kw in site.keywords)]
    )


def _under_tensor_check(ctx: ModuleContext, node: ast.AST) -> bool:
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, ast.If) and any(
            isinstance(test, ast.Call)
            and terminal_name(test.func) == "isinstance"
            and len(test.args) == 2
            and "Tensor" in set(names_in(test.args[1]))
            for test in ast.walk(ancestor.test)
        ):
            return True
    return False


def _host_value(ctx: ModuleContext, value: ast.AST, site: ast.AST, depth: int = 0) -> bool:
    """The expression certainly holds a Python number or string, not a tensor."""
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.Call):
        name = terminal_name(value.func)
        return (
            name in _HOST_METHODS
            if isinstance(value.func, ast.Attribute)
            else (name in _HOST_FUNCTIONS)
        )
    if isinstance(value, ast.Subscript):
        return "param_groups" in set(names_in(value.value))
    if isinstance(value, ast.BinOp):
        return _host_value(ctx, value.left, site, depth) and _host_value(
            ctx, value.right, site, depth
        )
    if isinstance(value, ast.Attribute):
        root: ast.expr = value
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and root.id in _CONFIG_ROOTS
    if isinstance(value, ast.Name) and depth < 3:
        bound = _assigned_values(ctx, value.id, site)
        return bool(bound) and all(_host_value(ctx, v, site, depth + 1) for v in bound)
    return False


def _assigned_values(ctx: ModuleContext, name: str, site: ast.AST) -> list[ast.expr]:
    """Values assigned to `name` in the function around `site` (its whole body)."""
    return ctx.assigned_values(name, site)


_TENSOR_METHODS = {"norm", "clip_grad_norm_", "isfinite", "isnan", "isinf", "abs", "sqrt"}
_REDUCTIONS = {"all", "any", "sum", "mean", "max", "min"}
_NOT_TENSOR_PREFIXES = (
    "torch.cuda.",
    "torch.distributed.",
    "torch.backends.",
    "torch.accelerator.",
)


def _tensor_tests(ctx: ModuleContext, tensor_names: set[str]) -> Iterator[Hit]:
    """`if norm_ratio < 1:` on a tensor in the step: Python asks the tensor for its truth
    value, which copies it to the host and waits for the GPU, like `.item()`."""
    for node in ctx.train_step_nodes:
        if not isinstance(node, (ast.If, ast.While, ast.Assert)) or ctx.periodic_guard(node):
            continue
        if any(isinstance(n, ast.Call) and _is_sync_method(n) for n in ast.walk(node.test)):
            continue  # `if loss.item() > x:` is reported as .item()
        keyword_ = "assert" if isinstance(node, ast.Assert) else "if"
        for tested in _names_tested(node.test):
            if (
                _tensor_expression(ctx, tested, node, 0)
                if not isinstance(tested, ast.Name)
                else tested.id in tensor_names or _tensor_valued(ctx, tested, 0)
            ):
                text = f"`{keyword_} {ast.unparse(node.test)}`"
                yield Hit("GD301", node.test, f": {text} reads a tensor")
                break


def _names_tested(test: ast.expr) -> list[ast.expr]:
    """Names whose truth or comparison the test takes (not names only passed to calls), and
    calls tested directly (`assert torch.isfinite(losses).all()`)."""
    if isinstance(test, ast.BoolOp):
        return [name for value in test.values for name in _names_tested(value)]
    if isinstance(test, ast.UnaryOp):
        return _names_tested(test.operand)
    if isinstance(test, ast.Compare):
        return [n for n in [test.left, *test.comparators] if isinstance(n, (ast.Name, ast.Call))]
    return [test] if isinstance(test, (ast.Name, ast.Call)) else []


def _tensor_valued(ctx: ModuleContext, name: ast.Name, depth: int) -> bool:
    """Every value bound to the name in its function is a tensor expression."""
    values = _assigned_values(ctx, name.id, name)
    return bool(values) and all(_tensor_expression(ctx, v, name, depth) for v in values)


def _tensor_expression(ctx: ModuleContext, value: ast.AST, site: ast.AST, depth: int) -> bool:
    if isinstance(value, ast.Call):
        qualified = ctx.call_names.get(value, "")
        if qualified.startswith("torch.") and not qualified.startswith(_NOT_TENSOR_PREFIXES):
            return True
        if qualified or not isinstance(value.func, ast.Attribute):
            return False  # `math.isfinite(x)`, `np.sqrt(x)`: another module's function
        if value.func.attr in _TENSOR_METHODS:
            return True
        # `torch.isfinite(x).all()`: a reduction of a tensor is a tensor
        return value.func.attr in _REDUCTIONS and _tensor_expression(
            ctx, value.func.value, site, depth
        )
    if isinstance(value, ast.BinOp):
        return any(_tensor_expression(ctx, side, site, depth) for side in (value.left, value.right))
    if isinstance(value, ast.Name) and depth < 3:
        return _tensor_valued(ctx, value, depth + 1)
    return False


def _opt_in_flags(ctx: ModuleContext) -> set[str]:
    """Command-line switches that are off unless given (`add_argument("--sync-timing",
    action="store_true")`), in the file or the files connected to it."""
    flags: set[str] = set()
    for module in ctx.component():
        for call in module.method_calls("add_argument"):
            options = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("--")
            ]
            action = keyword(call, "action")
            if options and isinstance(action, ast.Constant) and action.value == "store_true":
                dest = keyword(call, "dest")
                name = dest.value if isinstance(dest, ast.Constant) else options[0]
                flags.add(str(name).lstrip("-").replace("-", "_"))
    return flags


def _under_flag(ctx: ModuleContext, node: ast.AST, flags: set[str]) -> bool:
    """Inside `if args.<opt-in flag>:` (the user asked for this sync: timing, debugging)."""
    if not flags:
        return False
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, ast.If) and child in ancestor.body:
            test = ancestor.test
            both = isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)
            tests = test.values if both else [test]  # type: ignore[attr-defined]
            if any(isinstance(t, ast.Attribute) and t.attr in flags for t in tests):
                return True
        child = ancestor
    return False
