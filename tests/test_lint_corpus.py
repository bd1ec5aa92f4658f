"""`gpudiag lint` on real open-source training scripts (tests/lint_corpus, see SOURCES.md),
scored against hand labels (labels.txt): precision and recall per severity, computed here,
for each part of the corpus (bench/lint_corpus_split.py): the original projects (issue 10,
exact), the projects the issue-30 changes were tuned on, and the held-out projects
(HELD_OUT, HELD_OUT_2, HELD_OUT_3), whose every finding is labelled and whose figures are
the ones docs/lint.md reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpudiag.lint import RULES

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "lint_corpus"


def _load_tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "lint_corpus_tool", REPO / "tools" / "lint_corpus.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def _load_split():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "lint_corpus_split", REPO / "bench" / "lint_corpus_split.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


split = _load_split()


@pytest.fixture(scope="module")
def scored():  # type: ignore[no-untyped-def]
    return tool.score(CORPUS)


def test_corpus_is_real_and_labelled(scored) -> None:  # type: ignore[no-untyped-def]
    scripts = list(CORPUS.rglob("*.py"))
    assert len(scripts) >= 25
    sources = (CORPUS / "SOURCES.md").read_text()
    for project in {p.relative_to(CORPUS).parts[0] for p in scripts}:
        assert (CORPUS / project / "LICENSE").is_file(), project
        assert f"## {project}/" in sources
    for path, line, _ in scored.labels.expect | scored.labels.must_not:
        assert 1 <= line <= len((CORPUS / path).read_text().splitlines()), (path, line)
    assert not scored.labels.expect & scored.labels.must_not
    assert scored.errors == []


@pytest.fixture(scope="module")
def original(scored):  # type: ignore[no-untyped-def]
    return split.split(scored, "original")


def test_high_severity_precision_is_one(scored) -> None:  # type: ignore[no-untyped-def]
    high = scored.by_severity()["high"]
    assert high.tp > 0
    false_high = sorted(k for k in scored.false_positives if RULES[k[2]].severity == "high")
    assert false_high == [] and high.precision == 1.0


def test_no_false_positive_of_issue_10_comes_back(original) -> None:  # type: ignore[no-untyped-def]
    assert sorted(original.found & original.labels.must_not) == []


def test_precision_and_recall_per_severity(original) -> None:  # type: ignore[no-untyped-def]
    """Every finding on the original corpus was judged by hand; the counts are what
    docs/lint.md reports. A new false positive or a lost true one fails here with its
    location."""
    counts = original.by_severity()
    for severity, count in counts.items():
        assert count.tp + count.fp + count.fn > 0, severity
        assert count.precision == 1.0, (severity, sorted(original.false_positives))
        assert count.recall is not None and count.recall >= 0.95, (
            severity,
            sorted(original.false_negatives),
        )


@pytest.mark.parametrize("part", ["tuned", "held-out", "held-out-2", "held-out-3"])
def test_every_finding_of_the_new_projects_is_labelled(scored, part: str) -> None:  # type: ignore[no-untyped-def]
    """Labels exact: each finding is `expect` (true) or `must-not` (a judged false positive,
    kept in the figures); a finding nobody judged, or a lost true one, fails here."""
    score = split.split(scored, part)
    assert score.found, part
    assert sorted(score.found - score.labels.expect - score.labels.must_not) == []
    assert sorted(score.false_negatives) == sorted(
        key for key in score.false_negatives if "FN" in _note(key)
    )


def test_docs_report_the_measured_figures(scored) -> None:  # type: ignore[no-untyped-def]
    """docs/lint.md's table for the tuned and the held-out parts is the computed one."""
    docs = (REPO / "docs" / "lint.md").read_text()
    for part in ("tuned", "held-out", "held-out-2", "held-out-3"):
        for severity, c in split.split(scored, part).by_severity().items():
            row = f"| {part} | {severity} | {c.tp + c.fn} | {c.tp + c.fp} | {c.tp} | {c.fp} | {c.fn} |"
            assert row in docs, row


def _note(key: tuple[str, int, str]) -> str:
    """The comment of the label line of `key` in labels.txt."""
    path, line, code = key
    for raw in (CORPUS / "labels.txt").read_text().splitlines():
        if raw.startswith(f"{path}:{line} {code} "):
            return raw
    return ""


def test_one_file_linted_alone_sees_its_project() -> None:
    """Linting one file reads (never reports) the modules next to it that it imports or that
    import it: set_epoch in utils/train_utils.py, set_device in main.py."""
    from gpudiag.lint import lint_paths

    fsdp = CORPUS / "pytorch_examples" / "distributed" / "FSDP"
    mingpt = CORPUS / "pytorch_examples" / "distributed" / "minGPT-ddp" / "mingpt"
    t5 = lint_paths([fsdp / "T5_training.py"])
    assert t5.files == [str(fsdp / "T5_training.py")]
    assert "GD202" not in {f.code for f in t5.findings}
    assert "GD403" not in {f.code for f in lint_paths([mingpt / "trainer.py"]).findings}
