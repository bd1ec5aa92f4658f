"""Which files of a folder a Python source's imports name: read from the source, never
imported. One resolver for `gpudiag lint` (a run's project files) and for capture (the
modules of a traced script's folder, read for a profiler it would create)."""

from __future__ import annotations

import os
from collections.abc import Iterator


def module_candidates(path: str, dotted: str, ancestors: int = 4) -> Iterator[str]:
    """Files that `import <dotted>` written in `path` may load: relative imports from the
    file's package, absolute ones from the file's folder (the script folder is on sys.path)
    or a few folders above it (a package root)."""
    level = len(dotted) - len(dotted.lstrip("."))
    parts = [part for part in dotted.lstrip(".").split(".") if part]
    base = os.path.dirname(os.path.abspath(path))
    if level:
        for _ in range(level - 1):
            base = os.path.dirname(base)
        roots = [base]
    else:
        roots = [base]
        for _ in range(ancestors):
            parent = os.path.dirname(roots[-1])
            if parent == roots[-1]:
                break
            roots.append(parent)
    for root in roots:
        target = os.path.join(root, *parts)
        if parts:
            yield target + ".py"
        yield os.path.join(target, "__init__.py")
