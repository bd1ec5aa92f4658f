"""gpudiag's version, in a module of its own: capture (the run manifest), the package
root and pyproject.toml (``[tool.setuptools.dynamic]``) all read it from here, so no
module of a stage imports the package root for it."""

from __future__ import annotations

__version__ = "0.1.0"
