"""Renderers over a real analysis (a 2-rank NCCL trace set from ../shared/traces):
terminal (rich), standalone HTML (plotly) and the timeline they plot."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpudiag.analysis import analyze
from gpudiag.report.html import render_html
from gpudiag.report.terminal import print_report


@pytest.fixture(scope="module")
def result(shared_traces):
    return analyze(shared_traces / "hta_sampled_2of128")


def test_terminal_report_has_every_finding_field(result):
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    for f in result.findings:
        assert f.kind in text and f.severity.upper() in text and f.fix[:40] in text
    assert text.index("Findings") < text.index("Per rank")
    assert "comm exp" in text


def test_timeline_lanes_and_downsampling(result):
    tl = result.timeline()
    assert list(tl.columns) == ["rank", "lane", "start_ms", "end_ms", "name"]
    assert set(tl["lane"]) <= {"compute", "communication", "data_loading", "other", "idle", "step"}
    assert {"compute", "communication", "step"} <= set(tl["lane"])
    steps = tl[tl["lane"] == "step"]
    assert steps["name"].str.match(r"step \d+$").all()
    comm = tl[(tl["lane"] == "communication") & (tl["rank"] == 0)]
    assert "all_reduce" in set(comm["name"])  # each collective named by its op
    assert sorted(tl["rank"].unique()) == [0, 1]
    assert (tl["end_ms"] >= tl["start_ms"]).all()
    small = result.timeline(rank=1, max_intervals=50)
    assert len(small) <= 50 and set(small["rank"]) == {1}
    # merging never loses covered time of a lane, it only fills small gaps
    full = result.timeline(rank=1)
    for lane in ("compute", "communication"):
        f, s = full[full.lane == lane], small[small.lane == lane]
        assert (s.end_ms - s.start_ms).sum() >= (f.end_ms - f.start_ms).sum() - 1e-6


def test_html_escapes_and_inlines(result):
    html = render_html([result])
    # plotly.js inlined exactly once (it defines window.PlotlyConfig); charts use it
    assert html.count("window.PlotlyConfig") == 1 and "Plotly.newPlot" in html
    assert "Step breakdown" in html and "Timeline" in html
    assert "<script src" not in html
