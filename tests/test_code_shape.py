"""The house rule of issue 33: no function of gpudiag/ over 100 lines (a hub that holds
logic is split into steps a reader can take one at a time)."""

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
