"""A number that is a mean over ranks says so, with the ranks it is the mean of (probe
31l, F2). On a recorded 2-rank job whose rank 1 alone sleeps in its DataLoader's collate
(tests/fixtures/collate_rank1): compare's "data loading ms/step 22.02 → 5.38" (rank 1
43.58, rank 0 0.46) named no aggregation in the terminal or the Markdown, the Overview's
"which took 49.13 ms" stood beside bars of 48.61 and 49.64, and dataloader_stall's "step
of these ranks: 46.16 ms" said neither which statistic nor over which steps."""

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
from gpudiag.analysis.compare import compare  # noqa: E402
from gpudiag.analysis.steady import steady_steps  # noqa: E402
from gpudiag.report import numbers  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.markdown import comparison_markdown  # noqa: E402
from gpudiag.report.overview import evidence_lines  # noqa: E402
from gpudiag.report.terminal import print_comparison  # noqa: E402

RUNS = REPO / "tests" / "fixtures" / "collate_rank1"
APP = REPO / "dashboards" / "app.py"


def _most(result, column: str) -> str:  # type: ignore[no-untyped-def]
    """``43.58 (rank 1)``: the rank with the most of ``column`` in the per-rank table."""
    ranks = result.ranks.set_index("rank")[column].astype(float)
    return f"{numbers.num(ranks.max())} (rank {int(ranks.idxmax())})"


def _app(monkeypatch: pytest.MonkeyPatch, **params: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(RUNS)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(params)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_compare_says_mean_over_ranks_and_names_the_rank_with_the_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow, fast = analyze(RUNS / "collate40"), analyze(RUNS / "collate10")
    comparison = compare(slow, fast)
    data = f"{_most(slow, 'data_loading')} → {_most(fast, 'data_loading')}"
    assert data.startswith("43.58 (rank 1)"), data  # the one rank that waits for data
    metrics = {m["metric"]: m for m in comparison.to_json()["metrics"]}
    assert metrics["data_loading"]["a_most_rank"] == 1
    assert isinstance(metrics["data_loading"]["a_most_rank"], int)  # a rank, not 1.0
    assert metrics["steady_step_ms"]["a_most_rank"] is None
    mean = numbers.num(slow.ranks["data_loading"].astype(float).mean())
    buf = io.StringIO()
    print_comparison(comparison, Console(file=buf, width=400, color_system=None))
    terminal = buf.getvalue()
    markdown = comparison_markdown(comparison)
    for where, text in (("terminal", terminal), ("markdown", markdown)):
        row = next(line for line in text.splitlines() if "data loading ms/step" in line)
        assert mean in row and data in row, (where, row)
        assert "the mean over ranks" in text, where

    at = _app(monkeypatch, run="collate40", view="Compare", partner="collate10")
    table = next(d.value for d in at.dataframe if "most rank, A → B" in d.value.columns)
    row = table[table["metric"] == "data loading ms/step"].iloc[0]
    assert row["most rank, A → B"] == data
    assert "the mean over ranks" in " ".join(c.value for c in at.caption)


def test_overview_window_step_names_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    result = analyze(RUNS / "collate40")
    steps = result.ranks.set_index("rank")["step_ms_mean"].astype(float)
    want = (
        f"which took {numbers.ms(steps.mean())} (the mean over ranks; "
        + ", ".join(f"rank {r}: {numbers.ms(v)}" for r, v in steps.items())
        + ")"
    )
    assert want in render_html([result]).replace("&#x27;", "'"), want
    at = _app(monkeypatch, run="collate40")
    page = " ".join(e.value for e in [*at.caption, *at.markdown, *at.info, *at.warning])
    assert want in page.replace("\\", ""), want


def test_dataloader_stall_says_which_step_its_share_is_of() -> None:
    result = analyze(RUNS / "collate40")
    (stall,) = [f for f in result.findings if f.kind == "dataloader_stall"]
    assert stall.ranks == [1]
    steady = steady_steps(result.run_steps)
    rank1 = steady[steady["rank"] == 1]
    median = float(((rank1["end_ns"] - rank1["start_ns"]) / 1e6).median())
    lines = evidence_lines(stall.evidence)
    assert f"step of these ranks: {numbers.ms(median)}" in lines, lines
    assert "step basis: the rank's median step over its steady steps (warm-up left out)" in lines, (
        lines
    )
