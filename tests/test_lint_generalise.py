"""Issue 30: the classes of error found on projects the linter was not tuned on.

Each folder of tests/lint_cases/issue30 is a small project built from a pattern of a real
training repository (DeiT, DINO, ConvNeXt, pytorch/examples imagenet, accelerate, llm.c...),
linted as one run; its expected findings are marked in the files (`# expect: GD301`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudiag.cli.lint import main as lint_main
from gpudiag.lint import RULES, lint_paths

# every rule, the opt-in ones (GD701, GD702: off by default) included
ALL = ["GD"]

CASES = Path(__file__).parent / "lint_cases" / "issue30"
_EXPECT = re.compile(r"#\s*expect:\s*((?:GD\d{3}\s*)+)")

Mark = tuple[str, str, int]  # (file name under the case folder, code, line)


def marked(folder: Path) -> set[Mark]:
    marks: set[Mark] = set()
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = _EXPECT.search(line)
            if match:
                name = path.relative_to(folder).as_posix()
                marks.update((name, code, number) for code in match.group(1).split())
    return marks


def found(paths: list[Path], folder: Path) -> set[Mark]:
    result = lint_paths(paths, select=ALL)
    assert result.errors == []
    return {(Path(f.path).relative_to(folder).as_posix(), f.code, f.line) for f in result.findings}


@pytest.mark.parametrize("folder", sorted(p for p in CASES.iterdir() if p.is_dir()), ids=str)
def test_case_gives_exactly_the_marked_findings(folder: Path) -> None:
    assert found([folder], folder) == marked(folder)


def test_every_case_folder_checks_something() -> None:
    """A folder without marks still asserts what must not be reported (its negatives);
    together the folders cover every class of the issue."""
    codes = {code for folder in CASES.iterdir() for _, code, _ in marked(folder)}
    assert {"GD301", "GD403", "GD405", "GD601", "GD602", "GD701", "GD702", "GD704"} <= codes


def test_print_replaced_at_start_up_is_rank_zero_only() -> None:
    folder = CASES / "print_silenced"
    lines = (folder / "main.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if 'print(f"epoch' in text)
    assert ("main.py", "GD702", line) not in found([folder], folder)
    # the replacement lives in utils.py: linting main.py alone still reads it
    assert found([folder / "main.py"], folder) == set()


def test_library_module_linted_alone_sees_the_entry_script_beside_its_package() -> None:
    """set_epoch and destroy_process_group are in scripts/train.py, which reaches
    mylib/dist_util.py through mylib/__init__.py's re-exports."""
    folder = CASES / "library_pkg"
    assert found([folder / "mylib" / "dist_util.py"], folder) == set()


def test_library_module_without_entry_script_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "mylib"
    package.mkdir()
    for name in ("__init__.py", "dist_util.py"):
        (package / name).write_text((CASES / "library_pkg" / "mylib" / name).read_text())
    codes = {f.code for f in lint_paths([package / "dist_util.py"], select=ALL).findings}
    assert {"GD202", "GD503"} <= codes


def test_fp32_script_is_not_excused_by_a_sibling_amp_script() -> None:
    folder = CASES / "shared_helper"
    assert {code for _, code, _ in found([folder / "main_train.py"], folder)} == set()
    assert {(n, c) for n, c, _ in found([folder / "eval_linear.py"], folder)} == {
        ("eval_linear.py", "GD601")
    }


def test_rules_below_their_precision_on_held_out_code_moved_down() -> None:
    """Issue 30's rule, applied to the held-out figures as first measured (docs/lint.md):
    the medium rules whose held-out precision was under 0.9 are low now."""
    for code in ("GD301", "GD403", "GD602", "GD701", "GD704"):
        assert RULES[code].severity == "low", code
    assert RULES["GD303"].severity == "low"
    assert RULES["GD303"].relates_to == RULES["GD301"].relates_to == "host_sync"


def test_messages_say_what_applies() -> None:
    fix = RULES["GD601"].fix
    assert "bfloat16" in fix and "float16" in fix and "GradScaler" in fix and "V100" in fix
    assert "hang" not in RULES["GD503"].why and "warns" in RULES["GD503"].why
    assert "training" not in RULES["GD101"].message
    assert "inference" in RULES["GD101"].fix


def test_lint_accepts_json_flag(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CASES / "tensor_bool" / "train.py")
    assert lint_main(["--json", path]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"GD301": 2}
    assert lint_main(["--format", "json", path]) == 1
    assert json.loads(capsys.readouterr().out) == data
