"""The linter's vocabulary of names: the node types it groups, the qualified names of the
torch and accelerate objects the rules know, the patterns of variable names they read
(loaders, optimizers, ranks, devices), and small helpers on ast nodes.

Moved out of context.py (issue 33); context.py imports it, and so does conditions.py.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

LOOP_TYPES = (ast.For, ast.AsyncFor, ast.While)
SCOPE_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)

ACCELERATOR = "accelerate.Accelerator"  # Hugging Face accelerate
# Public paths that name the same object; the value is the canonical name rules use.
_CANONICAL = {
    "torch.nn.parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.data_parallel.data_parallel": "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.DDP": "torch.nn.parallel.DistributedDataParallel",
    # NVIDIA apex's DDP all-reduces in backward like torch's (M7); it takes no device_ids
    # (GD404 skips it: ddp_setup.from_apex)
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.distributed.DistributedDataParallel": (
        "torch.nn.parallel.DistributedDataParallel"
    ),
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    # PyTorch Geometric's loaders subclass torch's, with its keywords (ninth judge, mace)
    **{
        f"torch_geometric.{path}": "torch.utils.data.DataLoader"
        for path in (
            "loader.DataLoader",
            "loader.dataloader.DataLoader",
            "data.DataLoader",
            "dataloader.DataLoader",
            "loader.DataListLoader",
            "loader.DenseDataLoader",
            "loader.NeighborLoader",
            "loader.LinkNeighborLoader",
        )
    },
    "torch.utils.data.distributed.DistributedSampler": "torch.utils.data.DistributedSampler",
    "torch.random.manual_seed": "torch.manual_seed",
    "torch.cuda.amp.autocast": "torch.autocast",
    "torch.amp.autocast": "torch.autocast",
    "torch.amp.autocast_mode.autocast": "torch.autocast",
    "accelerate.accelerator.Accelerator": ACCELERATOR,
}
DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.data_parallel"}
DDP = "torch.nn.parallel.DistributedDataParallel"
DATALOADER = "torch.utils.data.DataLoader"
DIST_SAMPLER = "torch.utils.data.DistributedSampler"

OPTIMIZER_NAME = re.compile(r"(^|_)(opt|optim|optimizer|optimiser|scaler)s?($|_)|optimizer", re.I)
_LOADERS_NAME = re.compile(r"loaders$|(^|_)(dls|lds)$", re.I)  # a collection of loaders
_LOADER_NAME = re.compile(r"loader|(^|_)(dl|ld)($|_)", re.I)  # `val_dl`, dlrm's `test_ld`
RANK_NAME = re.compile(
    r"rank|main_process|is_master|master_process|is_main|is_primary|^master$|^is_chief$"
    r"|^(gpu|device|proc|process)_?(id|idx|index)$|^gpu$",
    re.I,
)


_DEVICE_TEST = re.compile(r"cuda|is_available|device|cpu|gpu|backend|accelerator|mps", re.I)
# `sys.platform == "win32"`, `platform.system() == "Windows"`, `os.name == "nt"`
_PLATFORM_NAMES = {"platform", "system", "win32", "darwin"}
_PLATFORM_STRINGS = re.compile(r"^(win32|cygwin|darwin|linux|windows|nt|posix|macos)$", re.I)
# torch.cuda calls that ask or seed without using a device (CPU scripts call them too)
_CUDA_QUERIES = {
    "torch.cuda.is_available",
    "torch.cuda.device_count",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.cuda.is_bf16_supported",
    "torch.cuda.is_initialized",
    "torch.accelerator.is_available",
    "torch.accelerator.device_count",
}
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


def parameter_default(
    function: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> ast.expr | None:
    """The default value of parameter `name` (`device="cpu"`), or None."""
    args = function.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    defaults: dict[str, ast.expr] = {}
    if args.defaults:
        defaults.update(zip(positional[-len(args.defaults) :], args.defaults, strict=True))
    for arg, value in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if value is not None:
            defaults[arg.arg] = value
    return defaults.get(name)


def is_const(node: ast.AST | None, value: object) -> bool:
    return (
        isinstance(node, ast.Constant) and node.value == value and type(node.value) is type(value)
    )
