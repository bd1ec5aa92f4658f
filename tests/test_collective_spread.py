"""The collectives table's wall time names its aggregation and its spread over ranks
(probe 31l, F1): in a straggler job the waiting ranks' all-reduce takes 40-50 ms per step
and the straggler's 13, and the table's one number (40.14, the mean over ranks) matched
no rank. Each view (terminal, HTML, dashboard) says "mean over ranks" and shows the
least and the most rank's wall, the same text in each, equal to the walls computed here
from the run's own calls (the union of each step's all-reduce intervals, per rank)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.report import numbers  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.terminal import print_report  # noqa: E402

STRAGGLER = REPO / "sample_runs" / "ddp4_straggler"
WALL_MEAN = "wall ms/step (mean over ranks)"
WALL_LEAST = "least rank ms/step"
WALL_MOST = "most rank ms/step"


def _walls_by_rank(calls) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Per rank, the mean over its steps of the merged all-reduce intervals (ms)."""
    calls = calls[(calls["op"] == "all_reduce") & (calls["step"] >= 0)]
    walls = {}
    for rank, of_rank in calls.groupby("rank"):
        total = 0
        for _, step in of_rank.groupby("step"):
            end = None
            for s, e in sorted(zip(step["start_ns"], step["end_ns"], strict=True)):
                if end is None or s > end:
                    total += e - s
                    end = e
                elif e > end:
                    total += e - end
                    end = e
        walls[int(rank)] = total / 1e6 / of_rank["step"].nunique()
    return walls


def test_wall_per_step_names_the_mean_and_the_least_and_most_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = analyze(STRAGGLER)
    walls = _walls_by_rank(result.collectives.frame())
    assert len(walls) == 4
    least = min(walls, key=walls.__getitem__)
    most = max(walls, key=walls.__getitem__)
    assert walls[most] > 3 * walls[least]  # the straggler's all-reduce is the short one
    least_text = f"{numbers.num(walls[least])} (rank {least})"
    most_text = f"{numbers.num(walls[most])} (rank {most})"
    mean_text = numbers.num(sum(walls.values()) / len(walls))

    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    terminal = buf.getvalue()
    html = render_html([result])
    for where, text in (("terminal", terminal), ("html", html)):
        assert WALL_MEAN in text, where
        assert least_text in text and most_text in text, (where, least_text, most_text)
        assert mean_text in text, where

    monkeypatch.setattr(sys, "argv", ["app.py", str(STRAGGLER)])
    at = AppTest.from_file(str(REPO / "dashboards" / "app.py"), default_timeout=300)
    at.query_params["view"] = "Communication"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if WALL_MEAN in d.value.columns)
    row = table.iloc[0]
    assert row[WALL_LEAST] == least_text
    assert row[WALL_MOST] == most_text
    assert numbers.num(row[WALL_MEAN]) == mean_text
    captions = " ".join(c.value for c in at.caption)
    assert "the mean over ranks" in captions and "the one with the least" in captions
