"""`gpudiag lint`: static checks for DataParallel / DDP anti-patterns (ast only, never runs code)."""

from __future__ import annotations

from gpudiag.lint.config import ConfigError
from gpudiag.lint.engine import lint_paths, lint_source
from gpudiag.lint.result import FileError, Finding, LintResult
from gpudiag.lint.rules import RULES, Rule

__all__ = [
    "RULES",
    "ConfigError",
    "FileError",
    "Finding",
    "LintResult",
    "Rule",
    "lint_paths",
    "lint_source",
]
