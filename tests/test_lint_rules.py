"""Every rule on its positive and negative snippets, and the realistic scripts.

Expected findings are marked in the case files themselves (`# expect: GD101 GD203`), so a
case reads as its own specification.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudiag.lint import RULES, lint_paths

CASES = Path(__file__).parent / "lint_cases"
RULE_CASES = CASES / "rules"
_EXPECT = re.compile(r"#\s*expect:\s*((?:GD\d{3}\s*)+)")
_CASE_NAME = re.compile(r"^gd(\d{3})_(?:\w+_)?(pos|neg)\.py$")


def expected(path: Path) -> set[tuple[str, int]]:
    marks = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            marks.update((code, number) for code in match.group(1).split())
    return marks


def found(path: Path) -> set[tuple[str, int]]:
    result = lint_paths([path])
    assert not result.errors, result.errors
    return {(f.code, f.line) for f in result.findings}


def rule_case_files(kind: str) -> list[Path]:
    return sorted(p for p in RULE_CASES.glob("gd*.py") if _CASE_NAME.match(p.name).group(2) == kind)


def code_of(path: Path) -> str:
    return "GD" + _CASE_NAME.match(path.name).group(1)


def test_every_rule_has_positive_and_negative_cases() -> None:
    for code in RULES:
        stem = code.lower()
        assert list(RULE_CASES.glob(f"{stem}_*pos.py")), f"{code} has no positive case"
        assert list(RULE_CASES.glob(f"{stem}_*neg.py")), f"{code} has no negative case"


@pytest.mark.parametrize("path", rule_case_files("pos"), ids=lambda p: p.name)
def test_positive_case(path: Path) -> None:
    code = code_of(path)
    marks = {mark for mark in expected(path) if mark[0] == code}
    assert marks, f"{path.name} marks no {code} line"
    assert {hit for hit in found(path) if hit[0] == code} == marks


@pytest.mark.parametrize("path", rule_case_files("neg"), ids=lambda p: p.name)
def test_negative_case(path: Path) -> None:
    code = code_of(path)
    assert not expected(path)
    assert [hit for hit in found(path) if hit[0] == code] == []


REALISTIC = ["article_dp.py", "article_ddp.py", "image_classification.py", "lm_finetune.py"]


@pytest.mark.parametrize("name", REALISTIC)
def test_realistic_script_gives_exactly_the_marked_findings(name: str) -> None:
    path = CASES / name
    marks = expected(path)
    assert marks
    assert found(path) == marks


@pytest.mark.parametrize("name", ["clean_ddp.py", "clean_ddp_cpu.py"])
def test_clean_ddp_script_has_no_finding(name: str) -> None:
    result = lint_paths([CASES / name])
    assert result.findings == [] and result.errors == []
    assert result.ok


def test_realistic_scripts_cover_the_issue_list() -> None:
    """The scripts together exercise DP, sampler, loader, host sync, DDP setup, AMP, rank 0."""
    codes = {code for name in REALISTIC for code, _ in expected(CASES / name)}
    for required in (
        "GD101",
        "GD202",
        "GD203",
        "GD301",
        "GD401",
        "GD402",
        "GD501",
        "GD601",
        "GD602",
        "GD701",
        "GD703",
    ):
        assert required in codes
