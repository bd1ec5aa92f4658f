"""A short ``?run=`` that two runs share (``runs/collate1`` and ``runsB/collate1``) was
reported as "collate1: no run of that name among the runs found" (probe 31l, F4): two
runs have that name. The page now says it is ambiguous and lists both, for ``?run=`` and
for Compare's ``?partner=``; a name no run has keeps its notice. Driven with Streamlit's
AppTest on two copies of a shipped sample run under two folders."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.dashboard_shown import url_errors  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SAMPLE = REPO / "sample_runs" / "ddp2_dataloader_bound"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("same_leaf")
    for folder in ("runs", "runsB"):
        shutil.copytree(SAMPLE, root / folder / "collate1")
    return root


def _errors(monkeypatch: pytest.MonkeyPatch, root: Path, **params: str) -> list[str]:
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    return url_errors(APP, 300, **params)


def test_a_name_two_runs_share_is_called_ambiguous_with_both(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    errors = _errors(monkeypatch, root, run="collate1")
    assert not [e for e in errors if "no run of that name" in e], errors
    (error,) = [e for e in errors if "ambiguous" in e]
    assert "runs/collate1" in error and "runsB/collate1" in error, error
    assert "2 runs have that name" in error and "showing runs/collate1" in error, error
    errors = _errors(monkeypatch, root, run="runs/collate1", view="Compare", partner="collate1")
    (error,) = [e for e in errors if "ambiguous" in e]
    assert "runsB/collate1" in error and "partner= in the URL" in error, error
    # a name no run has: still said so
    errors = _errors(monkeypatch, root, run="collate9")
    assert [e for e in errors if "collate9: no run of that name" in e], errors
