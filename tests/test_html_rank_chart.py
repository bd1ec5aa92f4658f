"""The HTML report draws the dashboard's per-rank chart (probe 31l, F6): its plotly chart
had no bar totals, though its caption quotes them ("The tallest bar is rank 3's (60.20
ms)"), the legend in reverse and the named rank's outline around every segment. On the
shipped 4-rank straggler run: the report holds the very SVG the dashboard's Overview
draws (AppTest), with each rank's total printed above its bar and the one outline."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from gpudiag.analysis import analyze
from gpudiag.report import numbers
from gpudiag.report.html import render_html

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "sample_runs" / "ddp4_straggler"


def test_html_report_draws_the_dashboards_rank_chart_with_its_totals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = analyze(RUN)
    page = render_html([result])
    match = re.search(r'<svg[^>]*class="gpudiag-rank-parts".*?</svg>', page, re.S)
    assert match, "no per-rank SVG chart in the HTML report"
    svg = match.group(0)
    totals = [numbers.num(v) for v in result.ranks["step_ms_mean"].astype(float)]
    assert totals == ["52.94", "53.66", "57.05", "60.20"]
    printed = re.findall(r'text-anchor="middle">([\d.]+)</text>', svg)
    assert printed == totals, printed
    assert "60.20 ms" in page  # the caption's tallest bar, now on the chart
    assert svg.count('class="named-rank"') == 1
    monkeypatch.setattr(sys, "argv", ["app.py", str(RUN)])
    at = AppTest.from_file(str(REPO / "dashboards" / "app.py"), default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [m.value for m in at.markdown if "gpudiag-rank-parts" in m.value]
    assert shown == [svg]
