"""The house rules of issue 33: no function of gpudiag/ over 100 lines (a hub that holds
logic is split into steps a reader can take one at a time), no module over 1,000 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpudiag"
MAX_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} {lines}"
                    )
    assert not long, long
    assert len(list(PACKAGE.rglob("*.py"))) > 50  # the package was found


MAX_MODULE_LINES = 1000


def test_no_module_is_over_1000_lines() -> None:
    """Issue 33: a module a newcomer can hold in mind (rundir.py was 3,541 lines, ingest.py
    1,747, worker.py 1,639); gpudiag/ and dashboards/."""
    roots = (PACKAGE, PACKAGE.parent / "dashboards")
    long = [
        f"{path.relative_to(PACKAGE.parent)} {count}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long
