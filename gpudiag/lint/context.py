"""What the rules need to know about one parsed module, computed once.

- import aliases, so `DP(...)`, `nn.DataParallel(...)` and
  `torch.nn.parallel.DistributedDataParallel(...)` resolve to one qualified name;
- the *step loops*: a for/while loop whose own body (not a nested loop's) calls
  backward() / optimizer.step() (directly or through a function of this file) or which
  iterates a DataLoader; every node executed once per step is in `step_nodes`;
- "GPU job" (a CUDA device is used) and "DDP code" (DDP built or any torch.distributed call);
- rank-0 guards (`if rank == 0:`, early `return` on other ranks, functions only called
  under such a guard) and periodic guards (`if step % n == 0:`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

LOOP_TYPES = (ast.For, ast.AsyncFor, ast.While)
SCOPE_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)

# Public paths that name the same object; the value is the canonical name rules use.
_CANONICAL = {
    "torch.nn.parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.data_parallel.data_parallel": "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.DDP": "torch.nn.parallel.DistributedDataParallel",
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    "torch.utils.data.distributed.DistributedSampler": "torch.utils.data.DistributedSampler",
    "torch.random.manual_seed": "torch.manual_seed",
    "torch.cuda.amp.autocast": "torch.autocast",
    "torch.amp.autocast": "torch.autocast",
    "torch.amp.autocast_mode.autocast": "torch.autocast",
}
DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.data_parallel"}
DDP = "torch.nn.parallel.DistributedDataParallel"
DATALOADER = "torch.utils.data.DataLoader"
DIST_SAMPLER = "torch.utils.data.DistributedSampler"

_OPTIMIZER_NAME = re.compile(r"(^|_)(opt|optim|optimizer|optimiser|scaler)s?($|_)|optimizer", re.I)
_LOADER_NAME = re.compile(r"loader|(^|_)dl($|_)", re.I)
_RANK_NAME = re.compile(
    r"rank|main_process|is_master|master_process|is_main|is_primary|^master$|^is_chief$"
    r"|^(gpu|device|proc|process)_?(id|idx|index)$|^gpu$",
    re.I,
)


_DEVICE_TEST = re.compile(r"cuda|is_available|device|cpu|gpu|backend", re.I)
_LEAF_TYPES = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)


def _children(node: ast.AST) -> list[ast.AST]:
    """ast.iter_child_nodes without Load/Store and operator singletons (a third of all nodes)."""
    children: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, list):
            children.extend(item for item in value if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST) and not isinstance(value, _LEAF_TYPES):
            children.append(value)
    return children


def canonical(qualified: str) -> str:
    if qualified.startswith("torch.distributed.distributed_c10d."):
        qualified = "torch.distributed." + qualified.rsplit(".", 1)[1]
    return _CANONICAL.get(qualified, qualified)


def terminal_name(node: ast.AST) -> str:
    """`self.optimizer` -> 'optimizer', `opt` -> 'opt', anything else -> ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def names_in(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    return (
        isinstance(node, ast.Constant) and node.value == value and type(node.value) is type(value)
    )


class ModuleContext:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.children: dict[ast.AST, list[ast.AST]] = {}
        self.calls: list[ast.Call] = []
        self.loops: list[ast.For | ast.AsyncFor | ast.While] = []
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.aliases: dict[str, str] = {}
        self.string_constants: list[str] = []
        self.identifiers: set[str] = set()  # every Name id and attribute name
        stack: list[ast.AST] = [tree]
        while stack:  # one pass over the tree: ast.walk plus parents/children
            parent = stack.pop()
            children = _children(parent)
            self.children[parent] = children
            for child in children:
                self.parents[child] = parent
            stack.extend(children)
            if isinstance(parent, ast.Name):
                self.identifiers.add(parent.id)
            elif isinstance(parent, ast.Attribute):
                self.identifiers.add(parent.attr)
            elif isinstance(parent, ast.Call):
                self.calls.append(parent)
            elif isinstance(parent, ast.keyword) and parent.arg:
                self.identifiers.add(parent.arg)
            elif isinstance(parent, LOOP_TYPES):
                self.loops.append(parent)
            elif isinstance(parent, FUNCTION_TYPES):
                self.functions.setdefault(parent.name, []).append(parent)
            elif isinstance(parent, (ast.Import, ast.ImportFrom)):
                self._add_import(parent)
            elif isinstance(parent, ast.Constant) and isinstance(parent.value, str):
                self.string_constants.append(parent.value)
        self.loops.sort(key=lambda loop: (loop.lineno, loop.col_offset))
        self.calls.sort(key=lambda c: (c.lineno, c.col_offset))
        self._add_module_level_aliases()
        self.call_names: dict[ast.Call, str] = {}
        self._calls_by_name: dict[str, list[ast.Call]] = {}
        self._calls_by_method: dict[str, list[ast.Call]] | None = None
        for call in self.calls:
            qualified = self.qualify(call.func)
            if qualified:
                self.call_names[call] = qualified
                self._calls_by_name.setdefault(qualified, []).append(call)
        self.optimizer_names = self._optimizer_names()
        self.dataloader_names = self._bound_names(DATALOADER)
        self.gpu_job = self._uses_cuda()
        self.ddp_code = any(
            name == DDP or name.startswith("torch.distributed.")
            for name in self.call_names.values()
        )
        self.step_functions = self._step_functions()
        self.step_loops = [loop for loop in self.loops if self._is_step_loop(loop)]
        self._step_loop_set = set(self.step_loops)
        self.step_nodes = self._step_nodes()
        self._references: dict[str, list[ast.AST]] | None = None
        self._training_loops: set[ast.AST] | None = None

    # ----------------------------------------------------------------- names

    def _add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.aliases[top] = top
            return
        if node.level or not node.module:
            return
        for alias in node.names:
            if alias.name != "*":
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _add_module_level_aliases(self) -> None:
        """`DDP = torch.nn.parallel.DistributedDataParallel` at module level."""
        for stmt in self.tree.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, (ast.Name, ast.Attribute))
            ):
                qualified = self.qualify(stmt.value)
                if qualified:
                    self.aliases[stmt.targets[0].id] = qualified

    def qualify(self, node: ast.AST) -> str | None:
        """Canonical dotted name of an imported object, or None for local names."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        parts.append(self.aliases[node.id])
        return canonical(".".join(reversed(parts)))

    def own_nodes(self, body: list[ast.stmt]) -> Iterator[ast.AST]:
        """Nodes of `body` that are not inside a nested loop, function, class or lambda."""
        stack: list[ast.AST] = list(reversed(body))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, LOOP_TYPES + SCOPE_TYPES):
                stack.extend(reversed(self.children[node]))

    def body_nodes(self, body: list[ast.stmt]) -> Iterator[ast.AST]:
        """All nodes of `body`, nested loops included, nested functions and classes excluded."""
        stack: list[ast.AST] = list(reversed(body))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, SCOPE_TYPES):
                stack.extend(reversed(self.children[node]))

    def calls_to(self, *qualified: str) -> list[ast.Call]:
        found = [call for name in qualified for call in self._calls_by_name.get(name, [])]
        return sorted(found, key=lambda call: (call.lineno, call.col_offset))

    def method_calls(self, *methods: str) -> list[ast.Call]:
        if self._calls_by_method is None:
            self._calls_by_method = {}
            for call in self.calls:
                if isinstance(call.func, ast.Attribute):
                    self._calls_by_method.setdefault(call.func.attr, []).append(call)
        found = [call for method in methods for call in self._calls_by_method.get(method, [])]
        return sorted(found, key=lambda call: (call.lineno, call.col_offset))

    def _bound_names(self, qualified: str) -> set[str]:
        """Names (`x`, `self.x` -> 'x') assigned from a call to `qualified`."""
        names: set[str] = set()
        for call in self.calls_to(qualified):
            parent = self.parents.get(call)
            if isinstance(parent, (ast.Assign, ast.AnnAssign)):
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                names.update(terminal_name(target) for target in targets)
        names.discard("")
        return names

    def _optimizer_names(self) -> set[str]:
        names: set[str] = set()
        for call, qualified in self.call_names.items():
            if qualified.startswith("torch.optim.") and ".lr_scheduler" not in qualified:
                parent = self.parents.get(call)
                if isinstance(parent, ast.Assign):
                    names.update(terminal_name(target) for target in parent.targets)
        return names

    def _uses_cuda(self) -> bool:
        if any(s == "cuda" or s.startswith("cuda:") for s in self.string_constants):
            return True
        if self.method_calls("cuda"):
            return True
        if any(name.startswith("torch.cuda.") for name in self.call_names.values()):
            return True
        # DP/DDP device_ids only exist for CUDA modules
        wrappers = self.calls_to(DDP, *DATA_PARALLEL)
        return any(
            not is_const(keyword(call, "device_ids"), None)
            for call in wrappers
            if keyword(call, "device_ids")
        )

    # ------------------------------------------------------------ step loops

    def is_backward(self, call: ast.Call) -> bool:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            return True
        return self.call_names.get(call) == "torch.autograd.backward"

    def is_optimizer_step(self, call: ast.Call) -> bool:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "step"):
            return False
        receiver = terminal_name(func.value)
        return bool(receiver) and (
            receiver in self.optimizer_names or bool(_OPTIMIZER_NAME.search(receiver))
        )

    def is_step_call(self, call: ast.Call) -> bool:
        return self.is_backward(call) or self.is_optimizer_step(call)

    def local_callee(self, call: ast.Call) -> str | None:
        """Name of a function/method of this file that `call` may call (`f()`, `self.f()`)."""
        func = call.func
        if isinstance(func, ast.Name) and func.id in self.functions:
            return func.id
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")
            and func.attr in self.functions
        ):
            return func.attr
        return None

    def _step_functions(self) -> set[str]:
        """Functions that perform a training step outside any loop of their own."""
        own_calls = {
            name: [n for d in defs for n in self.own_nodes(d.body) if isinstance(n, ast.Call)]
            for name, defs in self.functions.items()
        }
        result = {name for name, calls in own_calls.items() if any(map(self.is_step_call, calls))}
        changed = True
        while changed:
            changed = False
            for name, calls in own_calls.items():
                if name not in result and any(self.local_callee(c) in result for c in calls):
                    result.add(name)
                    changed = True
        return result

    def iterates_loader(self, loop: ast.AST) -> bool:
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            sources: list[ast.AST] = [loop.iter]
        else:  # while: `batch = next(it)` where it = iter(loader)
            sources = [
                n
                for n in self.own_nodes(loop.body)
                if isinstance(n, ast.Call) and terminal_name(n.func) == "next"
            ]
        return any(
            name in self.dataloader_names or _LOADER_NAME.search(name)
            for source in sources
            for name in names_in(source)
        )

    def _is_step_loop(self, loop: ast.AST) -> bool:
        for node in self.own_nodes(loop.body):
            if isinstance(node, ast.Call) and (
                self.is_step_call(node) or self.local_callee(node) in self.step_functions
            ):
                return True
        return self.iterates_loader(loop)

    def _step_nodes(self) -> set[ast.AST]:
        nodes: set[ast.AST] = set()
        for loop in self.step_loops:
            nodes.update(self.body_nodes(loop.body))
        # step functions and the functions called from per-step code run once per step too
        frontier = list(nodes)
        pending = set(self.step_functions)
        added: set[str] = set()
        while frontier or pending:
            for node in frontier:
                callee = self.local_callee(node) if isinstance(node, ast.Call) else None
                # `if step % eval_every == 0: evaluate()` does not run once per step
                if callee and not self.periodic_guard(node):
                    pending.add(callee)
            frontier = []
            for name in pending - added:
                added.add(name)
                for definition in self.functions[name]:
                    new = list(self.body_nodes(definition.body))
                    nodes.update(new)
                    frontier.extend(new)
            pending.clear()
        return nodes

    def in_step_loop(self, node: ast.AST) -> bool:
        return node in self.step_nodes

    def in_training_loop(self, node: ast.AST) -> bool:
        """Per-step code, or a loop (e.g. the epoch loop) that contains a step loop."""
        if node in self.step_nodes:
            return True
        if self._training_loops is None:
            self._training_loops = set()
            for loop in self.step_loops:
                for ancestor in self.ancestors(loop):
                    if isinstance(ancestor, SCOPE_TYPES):
                        break
                    if isinstance(ancestor, LOOP_TYPES):
                        self._training_loops.add(ancestor)
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, SCOPE_TYPES):
                return False
            if ancestor in self._training_loops:
                return True
        return False

    # --------------------------------------------------------------- guards

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, FUNCTION_TYPES):
                return ancestor
        return None

    def scope_of(self, node: ast.AST) -> ast.AST:
        return self.enclosing_function(node) or self.tree

    def periodic_guard(self, node: ast.AST) -> bool:
        """Inside an `if` whose test uses `%` (`if step % 100 == 0:`) in the same function."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, SCOPE_TYPES):
                return False
            if (
                isinstance(ancestor, (ast.If, ast.IfExp))
                and child is not ancestor.test
                and any(
                    isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                    for n in ast.walk(ancestor.test)
                )
            ):
                return True
            child = ancestor
        return False

    def device_conditional(self, node: ast.AST) -> bool:
        """Under `if torch.cuda.is_available():` / `if args.cpu:` or its else: a branch for
        one kind of device only, so CPU-only code there is not a finding in a GPU job."""
        child = node
        for ancestor in self.ancestors(node):
            if (
                isinstance(ancestor, (ast.If, ast.IfExp))
                and child is not ancestor.test
                and _is_device_test(ancestor.test)
            ):
                return True
            if _early_return_before(ancestor, child, _is_device_test):
                return True
            if isinstance(ancestor, SCOPE_TYPES):
                return False
            child = ancestor
        return False

    def exclusive_branches(self, first: ast.AST, second: ast.AST) -> bool:
        """The two nodes sit in different branches of one `if`: never both run."""
        branch_of_first: dict[ast.AST, str] = {}
        child = first
        for ancestor in self.ancestors(first):
            if isinstance(ancestor, ast.If):
                branch_of_first[ancestor] = "body" if child in ancestor.body else "orelse"
            child = ancestor
        child = second
        for ancestor in self.ancestors(second):
            if isinstance(ancestor, ast.If) and ancestor in branch_of_first:
                branch = "body" if child in ancestor.body else "orelse"
                return branch != branch_of_first[ancestor]
            child = ancestor
        return False

    def rank_guarded(self, node: ast.AST, depth: int = 0) -> bool:
        child = node
        for ancestor in self.ancestors(node):
            if (
                isinstance(ancestor, (ast.If, ast.IfExp))
                and child is not ancestor.test
                and _is_rank_test(ancestor.test)
            ):
                return True
            if _early_return_before(ancestor, child, _is_rank_test):
                return True
            if isinstance(ancestor, FUNCTION_TYPES):
                return depth < 5 and self._all_callers_guarded(ancestor.name, depth + 1)
            if isinstance(ancestor, (ast.ClassDef, ast.Lambda)):
                return False
            child = ancestor
        return False

    def _all_callers_guarded(self, function: str, depth: int) -> bool:
        """Every use of the function in this file (a call, or passed on as in
        mp.spawn(train, ...)) is rank-guarded. A function used nowhere here is an entry point
        whose callers are unknown: not guarded."""
        if self._references is None:
            self._references = {}
            for node in self.parents:
                name = None
                if isinstance(node, ast.Name) and node.id in self.functions:
                    name = node.id
                elif (
                    isinstance(node, ast.Attribute)
                    and node.attr in self.functions
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("self", "cls")
                ):
                    name = node.attr
                if name:
                    self._references.setdefault(name, []).append(node)
        references = self._references.get(function, [])
        return bool(references) and all(self.rank_guarded(ref, depth) for ref in references)


def _is_rank_test(test: ast.expr) -> bool:
    return any(_RANK_NAME.search(name) for name in names_in(test))


def _is_device_test(test: ast.expr) -> bool:
    return any(_DEVICE_TEST.search(name) for name in names_in(test))


def _early_return_before(
    block: ast.AST, child: ast.AST, is_guard: Callable[[ast.expr], bool]
) -> bool:
    """`if rank != 0: return` (a guard test, then return) earlier in the block of `child`."""
    for field in ("body", "orelse", "finalbody"):
        statements = getattr(block, field, None)
        if not isinstance(statements, list) or child not in statements:
            continue
        for stmt in statements[: statements.index(child)]:
            if (
                isinstance(stmt, ast.If)
                and is_guard(stmt.test)
                and any(isinstance(s, (ast.Return, ast.Continue, ast.Raise)) for s in stmt.body)
            ):
                return True
    return False
