"""Custom CUDA extensions in a job (twentieth judge, D2): votenet's pointnet2 grouping,
gather and interpolation kernels take `float*` only. Under autocast a convolution's fp16
output would reach them, so GD601's plain advice ("wrap forward in autocast") fails there
unless each custom autograd Function casts its inputs back: its fix says
`@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)`.

Evidence, from the job's files and what lies next to them on disk:

- a subclass of `torch.autograd.Function` whose `forward` / `backward` calls a function of
  an imported compiled module (named like one: `_ext`, `*_ext`, `*_cuda`, `*_C`, `*_cpp`,
  `*_ops`, `*_kernels`) or a custom op `torch.ops.<namespace>.<op>` (not `aten`);
- `torch.utils.cpp_extension.load(...)` / `load_inline(...)` called;
- a `setup.py` that builds a `CUDAExtension`, in a folder of a job file or the folder
  above it, or in a folder directly below a job file's (votenet's `pointnet2/setup.py`
  next to `train.py`). Not the folders beside a job file's folder: in a folder of several
  projects one project's extension says nothing of another.
"""

from __future__ import annotations

import ast
import os
import re

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext

_COMPILED = re.compile(r"(^|\.)(_ext|_C|_cuda|_cpp)$|_(ext|cuda|C|cpp|ops|kernels)$")
_LOADS = {"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"}
_FUNCTION = {"torch.autograd.Function", "torch.autograd.function.Function"}
_SETUP_LIMIT = 200_000


def extension_evidence(ctx: ModuleContext) -> str:
    """What shows a custom CUDA extension in the job of `ctx` ('' when nothing)."""
    modules = ctx.related()
    for module in modules:
        found = _in_source(module)
        if found:
            return found
    folders = sorted({os.path.dirname(os.path.abspath(m.path)) for m in modules if m.path})
    for folder in folders:
        found = _setup_below(folder) or _setup_in(os.path.join(os.path.dirname(folder), "setup.py"))
        if found:
            return found
    return ""


def _in_source(module: ModuleContext) -> str:
    for call, name in module.call_names.items():
        if name in _LOADS:
            return f"{_where(module, call)} compiles an extension with {name.rsplit('.', 1)[1]}()"
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.ClassDef) or not any(
            module.qualify(base) in _FUNCTION for base in node.bases
        ):
            continue
        for method in node.body:
            if isinstance(method, FUNCTION_TYPES) and method.name in ("forward", "backward"):
                for inner in ast.walk(method):
                    if isinstance(inner, ast.Call) and _compiled_call(module, inner):
                        return (
                            f"the autograd Function {node.name} calls the compiled"
                            f" {ast.unparse(inner.func)} ({_where(module, inner)})"
                        )
    return ""


def _compiled_call(module: ModuleContext, call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    dotted = module.qualify(func.value) or ""
    if dotted.startswith("torch.ops."):
        return not dotted.startswith("torch.ops.aten")
    return bool(dotted) and not dotted.startswith("torch") and bool(_COMPILED.search(dotted))


def _where(module: ModuleContext, node: ast.AST) -> str:
    return f"{os.path.basename(module.path or '<source>')}:{getattr(node, 'lineno', 0)}"


def _setup_below(folder: str) -> str:
    """Read only when GD601 fires, once per finding: no cache to go stale."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        entries = []
    candidates = [os.path.join(folder, "setup.py")] + [
        os.path.join(e.path, "setup.py")
        for e in entries
        if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
    ]
    return next((found for found in map(_setup_in, candidates) if found), "")


def _setup_in(candidate: str) -> str:
    try:
        if os.path.getsize(candidate) > _SETUP_LIMIT:
            return ""
        with open(candidate, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return ""
    if "CUDAExtension" not in text:
        return ""
    return f"{os.path.basename(os.path.dirname(candidate))}/setup.py builds a CUDAExtension"
