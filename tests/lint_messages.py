"""The findings of one case folder of tests/lint_cases/issue30, by the text of their line:
what the judges' message tests read (tests/test_lint_judge19.py, test_lint_judge20.py)."""

from __future__ import annotations

from pathlib import Path

from gpudiag.lint import lint_paths

CASES = Path(__file__).parent / "lint_cases" / "issue30"


def findings(folder: str, code: str) -> dict[str, tuple[str, str]]:
    """(message, fix) per source line text."""
    result = lint_paths([CASES / folder], select=["GD"])
    return {
        Path(f.path).read_text().splitlines()[f.line - 1].strip(): (f.message, f.to_json()["fix"])
        for f in result.findings
        if f.code == code
    }


def at(found: dict[str, tuple[str, str]], text: str) -> tuple[str, str]:
    return next(value for line, value in found.items() if text in line)
