"""Eighteenth judge: the messages that must fit their case (the findings themselves are
checked by the case folders of tests/lint_cases/issue30)."""

from __future__ import annotations

from pathlib import Path

from gpudiag.lint import RULES, lint_paths

CASES = Path(__file__).parent / "lint_cases" / "issue30"


def _messages(folder: str, code: str) -> dict[str, str]:
    """Message per source line text (line numbers move when the case is reformatted)."""
    result = lint_paths([CASES / folder], select=["GD"])
    return {
        Path(f.path).read_text().splitlines()[f.line - 1].strip(): f.message
        for f in result.findings
        if f.code == code
    }


def _at(messages: dict[str, str], text: str) -> str:
    return next(message for line, message in messages.items() if text in line)


def test_data_parallel_for_sync_batchnorm_names_convert_sync_batchnorm() -> None:
    messages = _messages("unit_test_dp", "GD101")
    assert "convert_sync_batchnorm" in _at(messages, "UserScatteredDataParallel(")
    assert "convert_sync_batchnorm" not in _at(messages, "nn.DataParallel(")


def test_logged_tensor_and_assert_messages() -> None:
    messages = _messages("logged_tensor", "GD301")
    scalar = _at(messages, "writer.add_scalar(")
    assert "add_scalar" in scalar and ".item()" in scalar and "hoist" not in scalar
    assert "wandb.log" in _at(messages, "wandb.log(")
    assert "hoist it out of the step" in _at(messages, "assert ")


def test_every_device_indexed_by_rank_gets_the_placed_detail() -> None:
    messages = _messages("rank_indexed_device", "GD403")
    assert "placed on cuda:<rank> explicitly" in _at(messages, "DistributedDataParallel(")


def test_accumulation_under_apex_ddp_names_disable_allreduce() -> None:
    apex = _messages("accumulation_else", "GD602")
    assert "disable_allreduce()" in _at(apex, "scaled_loss.backward()")
    assert "disable_allreduce" not in _at(apex, "scaler.scale(loss).backward()")


def test_assert_in_forward_says_hoist_or_drop() -> None:
    messages = _messages("module_forward", "GD301")
    assert "hoist it out of the step" in _at(messages, "assert (idx[:, [0]] == idx).all()")


def test_json_fix_is_the_cases_fix() -> None:
    """The finding's `fix` (JSON, SARIF) is the one that fits the case: hoist or drop an
    assert, apex's disable_allreduce(), convert_sync_batchnorm; the rule's otherwise."""
    fixes: dict[str, str] = {}
    for folder in ("module_forward", "accumulation_else", "unit_test_dp", "logged_tensor"):
        for finding in lint_paths([CASES / folder], select=["GD"]).findings:
            line = Path(finding.path).read_text().splitlines()[finding.line - 1].strip()
            fixes[line] = finding.to_json()["fix"]
    assert "hoist it" in next(f for line, f in fixes.items() if line.startswith("assert (idx"))
    assert "disable_allreduce()" in next(
        f for line, f in fixes.items() if line.startswith("scaled_loss.backward()")
    )
    assert "convert_sync_batchnorm" in next(
        f for line, f in fixes.items() if "UserScatteredDataParallel(" in line
    )
    assert fixes[next(line for line in fixes if line.startswith("writer.add_scalar("))] == (
        RULES["GD301"].fix
    )
