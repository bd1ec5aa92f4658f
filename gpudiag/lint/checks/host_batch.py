"""Which values in per-step code are host memory from a loader batch (a batch straight from
the DataLoader, its fields, what is derived from it on the host): GD301 / GD303 do not report
a host copy of those (host_sync.py)."""

from __future__ import annotations

import ast
import re

from gpudiag.lint.checks.host_iterators import host_iterator_batch
from gpudiag.lint.checks.host_results import library_result, python_int, unpacked_calls
from gpudiag.lint.checks.moved_later import moved_later
from gpudiag.lint.context import (
    LOOP_TYPES,
    ModuleContext,
    names_in,
    terminal_name,
)
from gpudiag.lint.device_moves import moves_to_gpu
from gpudiag.lint.parameter_calls import every_caller_passes

_SYNC_METHODS = ("item", "cpu", "numpy", "tolist")


_CHAIN_METHODS = {
    *_SYNC_METHODS,
    *("float", "double", "long", "int", "half", "detach", "clone", "flatten", "ravel", "squeeze"),
    *("byte", "bool"),
}


def _chain_root(receiver: ast.expr) -> ast.expr:
    """`data["judge"]` of `data["judge"].cpu().numpy()`: the value the chain starts from
    (argument-less copies and casts keep it where it is)."""
    while (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Attribute)
        and receiver.func.attr in _CHAIN_METHODS
        and not receiver.args
        and not receiver.keywords
    ):
        receiver = receiver.func.value
    return receiver


def _on_cpu_batch(
    ctx: ModuleContext, receiver: ast.AST, depth: int = 0, field: bool = False
) -> bool:
    """`labels.numpy()` on a batch straight from the DataLoader (bound by the loop target and
    never moved to the device in the loop) reads host memory: no device sync; also
    arithmetic of it with numbers (`(255 * ((x + 1) / 2.0)).byte()`), a field of it
    (`batch.sid.tolist()`, unless the loop moves the batch in place, PyG's `batch.to(device)`),
    and a parameter of a helper every caller passes such a batch (ocp's
    `check_traj_files(batch, ...)`; tenth judge)."""
    while isinstance(receiver, (ast.Subscript, ast.Attribute)):
        field = field or isinstance(receiver, ast.Attribute)
        receiver = receiver.value
    if isinstance(receiver, (ast.BinOp, ast.UnaryOp)):
        sides = (
            [receiver.operand]
            if isinstance(receiver, ast.UnaryOp)
            else [
                receiver.left,
                receiver.right,
            ]
        )
        tensors = [_chain_root(side) for side in sides if not isinstance(side, ast.Constant)]
        return bool(tensors) and all(_on_cpu_batch(ctx, side, depth, field) for side in tensors)
    if not isinstance(receiver, ast.Name):
        return False
    if depth < 3 and _batch_parameter(ctx, receiver, depth, field):
        return True
    if depth < 3 and _unpacked_from_batch(ctx, receiver, depth):
        return True
    if depth < 3 and (host_iterator_batch(ctx, receiver, depth) or moved_later(ctx, receiver)):
        return True
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
    if receiver.id not in bound or (
        field and _moved_in_place(ctx, loop.body, receiver.id, receiver)
    ):
        return False
    for node in ctx.body_nodes(loop.body):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if (
                any(
                    isinstance(n, ast.Name) and n.id == receiver.id
                    for t in targets
                    for n in ast.walk(t)
                )
                and not _stays_on_host(node.value, receiver.id)
                and not _rebound_after(ctx, node, receiver, loop)
            ):
                return False
    return True


def _unpacked_from_batch(ctx: ModuleContext, name: ast.Name, depth: int) -> bool:
    """`idx, question, actions, length = batch` in the loop body, where `batch` is a host
    batch straight from the DataLoader: each field unpacked from it is host memory too, as
    long as the name is bound by nothing else in its scope (`question =
    question.to(device)` would move it; habitat's pacman_trainer, eleventh judge)."""
    if ctx.assigned_values(name.id, name) or _bound_otherwise(ctx, name):
        return False
    scope = ctx.scope_of(name)
    sources: list[ast.expr] = []
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if any(isinstance(n, ast.Name) and n.id == name.id for n in ast.walk(target)):
                if not isinstance(target, (ast.Tuple, ast.List)) or not any(
                    isinstance(e, ast.Name) and e.id == name.id for e in target.elts
                ):
                    return False  # `(a, b)[0] = ...`, a starred or nested field: not followed
                sources.append(node.value)  # type: ignore[arg-type]
    return bool(sources) and all(
        isinstance(v, ast.Name) and _on_cpu_batch(ctx, v, depth + 1, True) for v in sources
    )


def _moved_in_place(
    ctx: ModuleContext, body: list[ast.stmt], name: str, site: ast.AST, depth: int = 0
) -> bool:
    """Before `site`: `batch.to(device)` / `batch.cuda()`, a move to the GPU (PyTorch
    Geometric's `Batch.to` moves the fields in place, its result used or not; not a cast,
    `batch.to(torch.float16)`, nor `batch.to("cpu")`), or the batch handed to a function of
    the project (ocp's `self._forward(batch)` does that move): its fields may be on the
    device from there on."""
    before = (site.lineno, site.col_offset)  # type: ignore[attr-defined]
    around = set(ctx.ancestors(site))  # `check_traj_files(batch)`: the call reading it
    for node in ctx.body_nodes(body):
        if not isinstance(node, ast.Call) or (node.lineno, node.col_offset) >= before:
            continue
        if node in around:
            continue
        if (
            isinstance(node.func, ast.Attribute)
            and terminal_name(node.func.value) == name
            and moves_to_gpu(node, ctx.call_names.get(node))
        ):
            return True
        if _hands_to_mover(ctx, node, name, depth):
            return True
    return False


def _hands_to_mover(ctx: ModuleContext, call: ast.Call, name: str, depth: int) -> bool:
    """`self._forward(batch)` where the project function moves its parameter
    (`batch.to(self.device)`) or hands it on to one that does; a helper that only reads it
    (ocp's `check_traj_files(batch, ...)`) moves nothing."""
    passed = [
        kw.arg for kw in call.keywords if isinstance(kw.value, ast.Name) and kw.value.id == name
    ]
    positions = [i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == name]
    if not passed and not positions:
        return False
    project = ctx.project
    key = project.callee(ctx, call) if project is not None else None
    if project is None or key is None or depth > 2:
        return key is not None
    target = project.module_of(key)
    for definition in project.definitions(key):
        params = [a.arg for a in [*definition.args.posonlyargs, *definition.args.args]]
        shift = (
            1 if params[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute) else 0
        )
        names = {params[i + shift] for i in positions if i + shift < len(params)}
        names |= {p for p in passed if p in params}
        end = ast.Call(func=ast.Name("_"), args=[], keywords=[], lineno=10**9, col_offset=0)
        if any(_moved_in_place(target, definition.body, p, end, depth + 1) for p in names):
            return True
    return False


def _batch_parameter(ctx: ModuleContext, name: ast.Name, depth: int, field: bool) -> bool:
    """A parameter of a helper, never reassigned there, that every call of the helper in the
    project passes a host batch straight from a DataLoader."""
    function = ctx.enclosing_function(name)
    if function is None or ctx.project is None or _rebound_before(ctx, function, name):
        return False
    if field and _moved_in_place(ctx, function.body, name.id, name):
        return False
    return every_caller_passes(
        ctx,
        function,
        name.id,
        lambda module, passed: (
            isinstance(passed, ast.Name) and _on_cpu_batch(module, passed, depth + 1, field)
        ),
    )


def _rebound_before(
    ctx: ModuleContext, function: ast.FunctionDef | ast.AsyncFunctionDef, name: ast.Name
) -> bool:
    """The parameter may hold something else than what the callers passed where `name`
    reads it: an assignment of it before the use, or one in a loop around the use. Not
    `batch = self.prepare(batch)` then `batch = to_cuda(batch)` after the use: the helper
    reads the batch while it is still on the host (F1: masks and lengths computed before
    the batch is moved)."""
    use = (name.lineno, name.col_offset)
    loops = {a for a in ctx.ancestors(name) if isinstance(a, LOOP_TYPES)}
    for node in ctx.body_nodes(function.body):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(t, ast.Name) and t.id == name.id for t in targets):
            continue
        reads_use = node.value is not None and any(n is name for n in ast.walk(node.value))
        if ((node.lineno, node.col_offset) < use and not reads_use) or loops & set(
            ctx.ancestors(node)
        ):
            return True
    return False


def _rebound_after(ctx: ModuleContext, assign: ast.AST, use: ast.AST, loop: ast.AST) -> bool:
    """`x = x.to(device)` after the use, in the loop's own body (not in a nested loop): the
    use still reads the batch the loop target bound this iteration (LlamaGen's
    `rgb_gts = x` before `x = x.to(device)`; ninth judge)."""
    after = (assign.lineno, assign.col_offset) > (use.lineno, use.col_offset)  # type: ignore[attr-defined]
    nearest = next((a for a in ctx.ancestors(assign) if isinstance(a, LOOP_TYPES)), None)
    return after and nearest is loop


_DEVICE_KEYWORDS = {"device", "out"}


def _host_batch_value(ctx: ModuleContext, value: ast.AST, seen: set[str], depth: int = 0) -> bool:
    """Host memory derived from the DataLoader batch: an alias (`gts = x`), arithmetic,
    methods that keep the device (`.permute(...)`, `.to("cpu", dtype=...)`) and `torch.*` /
    `F.*` functions of it with no device argument (`F.interpolate(x)`, `torch.clamp(x, 0,
    255)`): no device is involved, `.numpy()` of it syncs nothing (LlamaGen; ninth judge)."""
    if depth > 16:
        return False
    if isinstance(value, ast.Subscript):
        return _host_batch_value(ctx, value.value, seen, depth + 1)
    if isinstance(value, (ast.BinOp, ast.UnaryOp, ast.Compare)):
        sides = (
            [value.operand]
            if isinstance(value, ast.UnaryOp)
            else [value.left, *value.comparators]
            if isinstance(value, ast.Compare)
            else [value.left, value.right]
        )
        # `feature.size(2)`, `len(x)`: Python ints, even of a device tensor (F2)
        tensors = [s for s in sides if not isinstance(s, ast.Constant) and not python_int(s)]
        return bool(tensors) and all(_host_batch_value(ctx, t, seen, depth + 1) for t in tensors)
    if isinstance(value, ast.Name):
        if value.id in seen:  # `gts = (gts.permute(...) + 1) / 2`: the other values decide
            return True
        if _on_cpu_batch(ctx, value):
            return True
        values = ctx.assigned_values(value.id, value)
        inner = seen | {value.id}
        unpacked = None if values else unpacked_calls(ctx, value.id, value)
        if unpacked is not None:  # `segments, texts = encode_supervisions(batch, ...)` (F1)
            return not _bound_otherwise(ctx, value) and all(
                _host_batch_value(ctx, v, inner, depth + 1) for v in unpacked
            )
        return (
            any(value.id not in names_in(v) for v in values)  # a value not built from itself
            and not _bound_otherwise(ctx, value)
            and all(_host_batch_value(ctx, v, inner, depth + 1) for v in values)
        )
    if not isinstance(value, ast.Call) or any(k.arg in _DEVICE_KEYWORDS for k in value.keywords):
        return False
    arguments = [*value.args, *(k.value for k in value.keywords)]
    qualified = ctx.call_names.get(value) or ""
    if isinstance(value.func, ast.Attribute) and not qualified:  # a method of the value
        if value.func.attr not in _HOST_OPS or not all(_plain(ctx, a) for a in arguments):
            return False
        return _host_batch_value(ctx, value.func.value, seen, depth + 1)
    if qualified.startswith(("torch.nn.functional.", "torch.")) and value.args:
        if qualified.count(".") > 1 and not qualified.startswith("torch.nn.functional."):
            return False  # torch.cuda.*, torch.distributed.*: not a tensor function
        return _host_batch_value(ctx, value.args[0], seen, depth + 1) and all(
            _plain(ctx, a) for a in arguments[1:]
        )
    return library_result(ctx, value, lambda a: _host_batch_value(ctx, a, seen, depth + 1))


def _plain(ctx: ModuleContext, node: ast.AST) -> bool:
    """An argument that moves nothing to a device: numbers, strings other than a CUDA
    device, a dtype, tuples of those, an `args.size` option."""
    if isinstance(node, ast.Constant):
        return not (isinstance(node.value, str) and node.value.startswith("cuda"))
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_plain(ctx, e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _plain(ctx, node.operand)
    qualified = ctx.qualify(node) or ""
    if qualified.startswith("torch.") and qualified.count(".") == 1:
        return qualified not in ("torch.device",)  # torch.uint8, torch.float32
    return (
        isinstance(node, ast.Attribute)
        and terminal_name(node.value) in _CONFIG_ROOTS
        and not _DEVICE_OPTION.search(node.attr)
    )


_DEVICE_OPTION = re.compile(r"device|gpu|cuda|rank", re.I)


_HOST_KEEPING = {
    *_CHAIN_METHODS,
    *("byte", "bool", "short", "char", "permute", "transpose", "view", "reshape", "numpy"),
    *("unsqueeze", "contiguous", "mul", "add", "sub", "div", "clamp", "round"),
}


_HOST_OPS = {
    *_HOST_KEEPING,
    *("flip", "expand", "repeat", "clip", "mean", "sum", "to", "numpy"),
    *("max", "min", "amax", "amin", "argmax", "argmin", "prod", "cumsum"),
}


def _stays_on_host(value: ast.expr | None, name: str) -> bool:
    """`x = (255 * ((x + 1) / 2.0)).byte().numpy()`: the batch reassigned from itself, with
    numbers, arithmetic and casts (no device, no other tensor, no model): still host memory
    (BigGAN's make_hdf5.py, seventh judge)."""
    if value is None:
        return False
    for node in ast.walk(value):
        if isinstance(node, ast.Name) and node.id != name:
            return False
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in _HOST_KEEPING
            and all(isinstance(arg, ast.Constant) for arg in node.args)
            and not node.keywords
        ):
            return False
        if isinstance(node, ast.Attribute) and node.attr not in _HOST_KEEPING:
            return False
    return True


_CONFIG_ROOTS = {"args", "cfg", "config", "opt", "opts", "hparams"}


def _bound_otherwise(ctx: ModuleContext, name: ast.Name) -> bool:
    """`name` is also bound by a loop or `with` target, a parameter or a comprehension in
    its scope: values the assignments do not show."""
    scope = ctx.scope_of(name)
    arguments = getattr(scope, "args", None)
    if isinstance(arguments, ast.arguments) and name.id in {
        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    }:
        return True
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        targets: list[ast.AST] = []
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        if any(isinstance(n, ast.Name) and n.id == name.id for t in targets for n in ast.walk(t)):
            return True
    return False
