"""Running the user's script as ``__main__`` (part of the worker,
:mod:`gpudiag.capture.worker`): its target from the command line, ``sys.path`` and
the recursion limit as plain python would set them, whether the script profiles
itself, and what the rank's environment and torch say about it.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import runpy
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from gpudiag import rundir
from gpudiag.imports_on_disk import module_candidates


def _set_path_head(folder: str) -> None:
    """``folder`` first on sys.path, as python puts a script's folder there: in place of
    the entry python put for gpudiag's own module, or before the rest when python was
    started with -P (safe path: it put none)."""
    if sys.flags.safe_path:
        sys.path.insert(0, folder)
    else:
        sys.path[0] = folder


def parse_target(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if not argv:
        raise SystemExit("gpudiag worker: no script or -m module given")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("gpudiag worker: -m needs a module name")
        return {"module": argv[1]}, argv[2:]
    return {"script": argv[0]}, argv[1:]


def _rank_env() -> tuple[int, int, int]:
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("LOCAL_RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
    )


def torch_import_unfinished() -> bool:
    """torch's import began in this process and did not finish: a KeyboardInterrupt (or
    gpudiag's SIGTERM exception) raised inside it, e.g. Ctrl-C while set-up or the
    script imports torch. Python drops the half-run ``torch`` from sys.modules but keeps
    the extension torch._C and its C++ registrations (process-wide, never undone):
    importing torch again re-runs torch/__init__.py over them, which fails (duplicate
    registrations, "SystemError: ... bad call flags"), aborts (pybind11's "generic_type:
    cannot initialize type "GradBucket": an object with that name is already defined",
    thrown from torch._C._c10d_init: std::terminate, SIGABRT) or segfaults (probe 28j,
    F2: the traced process died of SIGABRT or SIGSEGV in 7 of 28 runs). Nothing at exit
    may import torch then. Also true while torch is still being imported (a finish from
    a signal handler inside the import)."""
    torch = sys.modules.get("torch")
    if torch is None:
        # any of its submodules left: the import ran that far, maybe into torch._C's
        # own initialisation (interrupted there, torch._C is gone from sys.modules
        # too, but the library stays loaded: a second init gave "SystemError: ...
        # method: bad call flags")
        return any(name.startswith("torch.") for name in list(sys.modules))
    return bool(getattr(getattr(torch, "__spec__", None), "_initializing", False))


def _torch_versions() -> dict[str, Any]:
    import torch

    versions: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        if torch.cuda.is_available():
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            versions["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    return versions


def _device(local_rank: int) -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{local_rank % max(1, torch.cuda.device_count())}"
    return "cpu"


def _backend() -> str | None:
    """The process group's backend; None without one. Never imports torch.distributed:
    a script that did not import it has no group (and at exit after an interrupted
    import of torch, importing it would crash the process: see torch_import_unfinished)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or torch_import_unfinished():
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:
        pass
    return None


# a profiler the script creates (not a record_function it only annotates with)
_PROFILER_CALL = re.compile(r"profiler\.profile\s*\(")
_PROFILER_IMPORT = re.compile(
    r"from\s+torch\.(?:autograd\.)?profiler\s+import\s+(\([^)]*\)|[^\n]*)"
)


def _profiles_itself(target: dict[str, str]) -> bool:
    """The script's own source (its module's for ``-m``), or a module of its own folder
    it imports (transitively, at most :data:`_MAX_SOURCES` files), creates a torch
    profiler: read, never imported; an unreadable file is taken as not profiling. A
    helper module's `start()` that creates one at step 7 inside an open range crashed the
    job in 3 of 6 runs when only the script was read (probe 28d, defect 9)."""
    path = _target_path(target)
    if not path:
        return False
    root = os.path.dirname(os.path.abspath(path))
    pending, seen = [os.path.abspath(path)], set[str]()
    while pending and len(seen) < _MAX_SOURCES:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        text = rundir.read_text(current, max_bytes=8 << 20)
        if not text:
            continue
        if _creates_profiler(text):
            return True
        pending.extend(_local_imports(text, current, root))
    return False


# the files of the script's folder read for a profiler (each rank reads them at start)
_MAX_SOURCES = 64


def _target_path(target: dict[str, str]) -> str | None:
    path = target.get("script")
    if path is None and target.get("module"):
        try:
            from importlib.util import find_spec

            spec = find_spec(target["module"])
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None else None
    if path and os.path.isdir(path):  # `python pkgdir` runs pkgdir/__main__.py
        path = os.path.join(path, "__main__.py")
    return path


def _creates_profiler(text: str) -> bool:
    if _PROFILER_CALL.search(text):
        return True
    if any(re.search(r"\bprofile\b", m[1]) for m in _PROFILER_IMPORT.finditer(text)):
        return True
    # the profiler module under another name: `from torch import profiler as P`,
    # `import torch.profiler as tp` (ninth probe: missed, and the job crashed), then
    # `P.profile(` / `tp.profile(`
    aliases = {m["alias"] or m["alias2"] for m in _PROFILER_MODULE_ALIAS.finditer(text)}
    return any(re.search(rf"\b{re.escape(a)}\.profile\s*\(", text) for a in aliases)


def _local_imports(text: str, path: str, root: str) -> list[str]:
    """The files of ``root`` (the script's folder, sys.path[0]) or of ``path``'s package
    that ``text``'s imports name: `import helpers`, `from utils.prof import start`,
    `from .prof import start`."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    dotted: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            dotted += [
                module,
                *(f"{module}.{a.name}" if node.module else module + a.name for a in node.names),
            ]
    found = []
    for name in dotted:
        # absolute imports from the script's folder (sys.path[0]), relative from the file's
        where = path if name.startswith(".") else os.path.join(root, "__main__.py")
        found += [c for c in module_candidates(where, name, ancestors=0) if os.path.isfile(c)]
    return found


_PROFILER_MODULE_ALIAS = re.compile(
    r"(?:from\s+torch(?:\.autograd)?\s+import\s+[^\n]*?\bprofiler\s+as\s+(?P<alias>\w+)"
    r"|import\s+torch(?:\.autograd)?\.profiler\s+as\s+(?P<alias2>\w+))"
)


# frames above _run_target's stack until the script's module runs (runpy's run_path,
# _run_module_code, _run_code, and two more the limit counts there: measured, a script
# then recurses exactly as deep as under plain python, 998 frames at the default limit)
_RUNPY_FRAMES = 5


@contextlib.contextmanager
def _argv0_as_given(script: str) -> Iterator[None]:
    """While ``runpy.run_path(os.path.abspath(script))`` starts: its sys.argv[0] is
    ``script`` as the user wrote it (runpy sets the path it was given; python and torchrun
    leave ``scripts/x.py`` relative: probe 28d). Only the first argv[0] runpy sets is
    changed, so the script's own run_path calls are python's."""
    original: Any = getattr(runpy, "_ModifiedArgv0", None)
    if original is None:  # another runpy: argv[0] stays absolute
        yield
        return

    class AsGiven(original):
        def __init__(self, value: Any) -> None:
            setattr(runpy, "_ModifiedArgv0", original)  # noqa: B010 - private, not typed
            super().__init__(script)

    setattr(runpy, "_ModifiedArgv0", AsGiven)  # noqa: B010
    try:
        yield
    finally:
        if getattr(runpy, "_ModifiedArgv0", None) is AsGiven:
            setattr(runpy, "_ModifiedArgv0", original)  # noqa: B010


def _make_room_for_our_frames() -> None:
    """Raise the recursion limit by the frames gpudiag and runpy put under the script's
    module: under plain python the module is the first frame, and a script recursing
    to within a few frames of the limit ran out 13 frames early (sixth probe)."""
    depth = 0
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    try:
        sys.setrecursionlimit(sys.getrecursionlimit() + depth + _RUNPY_FRAMES)
    except (RecursionError, ValueError):
        pass


def _init_method(args: tuple, kwargs: dict[str, Any]) -> str | None:
    """init_process_group's rendezvous: its ``init_method`` (``tcp://A:P``,
    ``file://...``), ``store`` when given a store, else ``env://MASTER_ADDR:MASTER_PORT``."""
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if isinstance(method, str) and method and method != "env://":
        return method[:500]
    if kwargs.get("store") is not None or (len(args) > 5 and args[5] is not None):
        return "store"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"env://{addr}:{port}"[:500]
    return None


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return None
