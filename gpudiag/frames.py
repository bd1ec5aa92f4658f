"""Which frames of a Python stack are library code and which are the user's.

Library code is decided by where it is installed, never by a folder's name: a checkout
cloned into a folder named ``gpudiag``, or a user's project under a folder named
``torch``, keeps its frames. The library is:

- the directories torch and gpudiag are imported from (found with ``find_spec``: torch
  is not imported for it);
- the running interpreter's standard library and site-packages (``sysconfig``'s
  stdlib/platstdlib/purelib/platlib, ``site.getsitepackages()``, the user site);
- pseudo-files such as ``<frozen importlib._bootstrap>`` or ``<string>``.

Each is resolved once, with symbolic links resolved (``os.path.realpath``), and a file is
library code when its real path lies under one of them. gpudiag's reference trainers
(``gpudiag.reference``) are the training script when one runs them: user code.

Stacks read back later may come from another interpreter or machine (a run recorded
elsewhere and analysed here). Two rules cover those paths too: a file under a folder named
``site-packages`` or ``dist-packages``, or under an interpreter's library tree
(``.../lib/python3.11/``), is installed code; and a file that does not exist here is
torch's or gpudiag's when its path below a folder named ``torch`` or ``gpudiag`` names
a file of the package installed here (``.../torch/distributed/distributed_c10d.py``).
A file that exists here is judged only by where it is, so ``/x/gpudiag/train.py`` and
``/x/torch/train.py`` are the user's.
"""

from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig
from importlib import util

# the packages whose frames are never the user's (name -> found by find_spec)
PACKAGES = ("torch", "gpudiag")
# gpudiag's own modules that are the training script when run (python -m gpudiag.reference)
USER_MODULES = ("gpudiag.reference",)
_INSTALL_FOLDERS = frozenset(("site-packages", "dist-packages"))
_INTERPRETER_LIB = re.compile(r"^python\d+\.\d+t?$")


def _cwd_or_none() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was deleted
        return None


# A relative frame file is relative to where the process started: the script may chdir
# later, or delete the folder it is in (os.getcwd() then raises).
_START_CWD = _cwd_or_none()


def absolute(filename: str) -> str:
    """``filename`` made absolute against the folder the process started in; never
    raises (a deleted current folder included)."""
    if os.path.isabs(filename):
        return filename
    return os.path.join(_START_CWD or os.sep, filename)


def _package_dir(name: str) -> str | None:
    if name == "gpudiag":
        return os.path.dirname(os.path.realpath(__file__))
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        try:
            spec = util.find_spec(name)  # a top-level package: nothing is imported
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return None
        if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
            origin = spec.origin
        elif spec.submodule_search_locations:
            return os.path.realpath(list(spec.submodule_search_locations)[0])
        else:
            return None
    return os.path.dirname(os.path.realpath(origin))


@functools.cache
def package_dirs() -> dict[str, str]:
    """Real directory of each of :data:`PACKAGES` that is installed here."""
    dirs = {}
    for name in PACKAGES:
        folder = _package_dir(name)
        if folder is not None:
            dirs[name] = folder
    return dirs


def _site_dirs() -> list[str]:
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site.py
        pass
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


@functools.cache
def library_dirs() -> tuple[str, ...]:
    """Real directories whose files are library code (each ending with a separator)."""
    paths = sysconfig.get_paths()
    found = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += [*package_dirs().values(), *_site_dirs()]
    real = {os.path.join(os.path.realpath(p), "") for p in found if p}
    return tuple(sorted(real - {os.sep}))  # never the whole filesystem


def _module_name(parts: list[str]) -> str:
    if parts and parts[-1].endswith(".py"):
        parts = [*parts[:-1], parts[-1][:-3]]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _foreign_module(parts: list[str]) -> str | None:
    """torch's or gpudiag's module for a path from elsewhere whose tail below a folder
    named like the package names a file of the package installed here."""
    dirs = package_dirs()
    for i in range(len(parts) - 2, -1, -1):
        folder = dirs.get(parts[i])
        if folder is not None and os.path.isfile(os.path.join(folder, *parts[i + 1 :])):
            return _module_name([parts[i], *parts[i + 1 :]])
    return None


@functools.lru_cache(maxsize=8192)
def _classify(filename: str) -> tuple[bool, str | None]:
    """(library code?, torch/gpudiag module name or None) of one frame's file."""
    if not filename or (filename.startswith("<") and filename.endswith(">")):
        return True, None
    try:
        real = os.path.realpath(absolute(filename))
    except (OSError, ValueError):  # a path with NUL, a loop of links
        real = absolute(filename)
    module = None
    for name, folder in package_dirs().items():
        if real.startswith(os.path.join(folder, "")):
            rel = os.path.relpath(real, folder).split(os.sep)
            module = _module_name([name, *rel])
            break
    if module is None and not os.path.exists(real):
        module = _foreign_module(real.split(os.sep))
    if module is not None:
        user = any(module == m or module.startswith(m + ".") for m in USER_MODULES)
        return not user, module
    if real.startswith(library_dirs()):
        return True, None
    parts = real.split(os.sep)[:-1]
    installed = any(p in _INSTALL_FOLDERS for p in parts) or any(
        a in ("lib", "lib64") and _INTERPRETER_LIB.match(b)
        for a, b in zip(parts, parts[1:], strict=False)
    )
    return installed, None


def is_library_file(filename: str) -> bool:
    """True for a frame's file that is not the user's code (see the module's docstring)."""
    return _classify(filename)[0]


def is_user_file(filename: str) -> bool:
    return not _classify(filename)[0]


def package_module(filename: str) -> str | None:
    """The dotted module of torch or gpudiag a frame's file is, e.g.
    ``torch.distributed.distributed_c10d``; None for any other file."""
    return _classify(filename)[1]


def in_module(filename: str, prefix: str) -> bool:
    """The file is module ``prefix`` of torch or gpudiag or lies below it
    (``in_module(f, "torch.distributed")``)."""
    module = package_module(filename)
    return module is not None and (module == prefix or module.startswith(prefix + "."))


_TRACEBACK_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


def user_frame(stack_text: str) -> str | None:
    """Innermost frame of a Python traceback or stack that is the user's code (not torch,
    not the standard library, not gpudiag, not an installed package: :func:`is_user_file`),
    as "path:line"."""
    best = None
    for path, line in _TRACEBACK_FRAME_RE.findall(stack_text or ""):
        if is_user_file(path):
            best = f"{path}:{line}"
    return best
