"""Twentieth judge: the messages and the command line that must fit their case (the
findings themselves are checked by the case folders of tests/lint_cases/issue30)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.cli.lint import main as lint_main
from gpudiag.lint import RULES, lint_paths
from tests.lint_messages import CASES, at, findings


@pytest.mark.parametrize(
    ("folder", "evidence"),
    [
        ("extension_fp32", "GroupingOperation calls the compiled _ext.group_points_wrapper"),
        ("extension_loaded", "compiles an extension with load()"),
        ("extension_setup", "csrc/setup.py builds a CUDAExtension"),
    ],
)
def test_no_autocast_over_a_cuda_extension_names_custom_fwd(folder: str, evidence: str) -> None:
    message, fix = at(findings(folder, "GD601"), "loss.backward()")
    assert evidence in message
    assert "torch.amp.custom_fwd(device_type='cuda', cast_inputs=torch.float32)" in message
    assert "custom_fwd" in fix and "autocast" in fix and fix != RULES["GD601"].fix


def test_no_autocast_without_an_extension_keeps_the_rule_text() -> None:
    result = lint_paths([CASES / "extension_loaded" / "plain.py"], select=["GD"])
    (finding,) = [f for f in result.findings if f.code == "GD601"]
    assert finding.message == RULES["GD601"].message
    assert finding.to_json()["fix"] == RULES["GD601"].fix


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("first = DDP(", "True unless getattr(model.config, 'gradient_checkpointing', False)"),
        ("second = DDP(", "True unless args.ckpt"),
    ],
)
def test_conditional_find_unused_parameters_is_worded_as_conditional(text: str, when: str) -> None:
    message, _ = at(findings("conditional_unused", "GD401"), text)
    assert "find_unused_parameters is conditional" in message and when in message


def test_options_through_kwargs_name_the_call_that_leaves_them_off() -> None:
    message, _ = at(findings("loader_parameter", "GD204"), "sampler=sampler)")
    lines = (CASES / "loader_parameter" / "train.py").read_text().splitlines()
    caller = next(i for i, text in enumerate(lines, 1) if "tr_loader = loader(" in text)
    assert "options come through **kwargs" in message
    assert message.endswith(f"loader_parameter/train.py:{caller} passes no pin_memory")


def test_replicate_on_every_rank_is_a_low_rule_of_its_own() -> None:
    rule = RULES["GD102"]
    assert rule.severity == "low" and rule.default
    assert "all_gather" in rule.fix


def test_a_folder_without_python_files_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("no code here\n")
    assert lint_main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"gpudiag lint: no Python files under {tmp_path}"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--json", "--format", "sarif"], 2),
        (["--format", "sarif", "--json"], 2),
        (["--format", "text", "--json"], 2),
        (["--json"], 0),
        (["--format", "json"], 0),
        (["--json", "--format", "json"], 0),
    ],
)
def test_json_with_another_format_is_a_usage_error(
    argv: list[str], code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One format asked for (JSON twice is one) prints it; two is a one-line usage error."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.zeros(1)\n")
    assert lint_main([*argv, str(script)]) == code
    captured = capsys.readouterr()
    if code:
        assert captured.out == "" and "ask for two formats" in captured.err
        assert len(captured.err.strip().splitlines()) == 1
    else:
        assert captured.out.lstrip().startswith("{")
