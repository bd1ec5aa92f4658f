"""Renderers over a real analysis (a 2-rank NCCL trace set from ../shared/traces):
terminal (rich), standalone HTML (plotly) and the timeline they plot."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpudiag.analysis import analyze
from gpudiag.analysis.result import MAX_TIMELINE_RANKS
from gpudiag.paths import sample_runs_dir
from gpudiag.report.html import render_html
from gpudiag.report.terminal import print_report
from tests.copied_ranks import copied_ranks, link_ranks


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
    assert "Where each rank" in html and "Timeline" in html  # the per-rank split first
    assert html.index("class='verdict'") < html.index("Where each rank") < html.index("Findings")
    assert "<script src" not in html


def test_timeline_of_a_large_run_draws_a_readable_subset(tmp_path: Path) -> None:
    """Above MAX_TIMELINE_RANKS ranks the Timeline (report, dashboard) draws the ranks
    named by findings, then the slowest and the fastest, not every rank's lanes; every
    view of it shares one time origin, so a rank drawn alone lines up as drawn with the
    others."""
    sources = sorted((sample_runs_dir() / "ddp4_straggler" / "traces").glob("rank*.json.gz"))
    ranks = MAX_TIMELINE_RANKS + 16
    run = link_ranks(sources, ranks, tmp_path / "traces")
    result = analyze(run, run_tasks=copied_ranks(sources))
    assert len(result.ranks) == ranks
    drawn = result.timeline_ranks()
    assert drawn is not None and len(drawn) == MAX_TIMELINE_RANKS
    named = {r for f in result.findings for r in f.ranks}
    slowest = int(result.ranks.sort_values("step_ms_mean")["rank"].iloc[-1])
    fastest = int(result.ranks.sort_values("step_ms_mean")["rank"].iloc[0])
    assert named and set(drawn) >= {min(named), slowest, fastest}
    everyone = result.timeline(max_intervals=10**9)
    assert sorted(everyone["rank"].unique()) == drawn
    for rank in (drawn[0], slowest):
        alone = result.timeline(rank, max_intervals=10**9)
        rows = everyone[everyone["rank"] == rank].reset_index(drop=True)
        pd.testing.assert_frame_equal(alone, rows, check_exact=True)
    assert everyone["start_ms"].min() >= 0
    html = render_html([result])
    assert f"Timeline: {MAX_TIMELINE_RANKS} of {ranks} ranks" in html


def test_a_rank_drawn_alone_keeps_the_run_time_origin() -> None:
    result = analyze(sample_runs_dir() / "ddp4_straggler", workers=1)
    assert result.timeline_ranks() is None  # a small run: every rank
    everyone = result.timeline(max_intervals=10**9)
    starts = everyone.groupby("rank")["start_ms"].min()
    assert starts.min() == 0 and starts.max() > 0  # the ranks did not start together
    for rank in starts.index:
        alone = result.timeline(int(rank), max_intervals=10**9)
        rows = everyone[everyone["rank"] == rank].reset_index(drop=True)
        pd.testing.assert_frame_equal(alone, rows, check_exact=True)
    pair = result.timeline(ranks=[1, 3], max_intervals=10**9)
    want = everyone[everyone["rank"].isin([1, 3])].reset_index(drop=True)
    pd.testing.assert_frame_equal(pair, want, check_exact=True)


def test_plotly_charts_show_a_runs_text_as_text(shared_traces: Path) -> None:
    """Plotly reads `<b>`, `<br>`, `<a>` in names, ticks and hover text as markup: a run
    folder named `evil2 <b>BOLD<br>NL <i>IT <a href=...>LINK` drew a bold, broken, linked
    legend entry in Compare (probe 31h, D6), and a real AMD trace's kernel
    `ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)` lost its template argument
    as an unknown tag. Both reach plotly as entities, shown as the characters."""
    from gpudiag.report import figures

    evil = 'evil2 <b>BOLD<br>NL <i>IT <a href="https:evil.invalid">LINK'
    deltas = pd.DataFrame({"metric": ["step"], "a": [1.0], "b": [2.0]})
    fig = figures.compare_figure(deltas, evil, "plain")
    assert fig.data[0].name == "A: evil2 &lt;b&gt;BOLD&lt;br&gt;NL &lt;i&gt;IT &lt;a " + (
        'href="https:evil.invalid"&gt;LINK'
    )
    result = analyze(shared_traces / "tracelens_mi300_ddp")
    fig = figures.timeline_figure(result.timeline(), gpu=True)
    hover = [t for trace in fig.data for t in (trace.text or ()) if t]
    assert any("ncclDevKernelArgsStorage&lt;4096ul&gt;)" in t for t in hover)
    assert not any("<" in t for t in hover)
    skew = pd.DataFrame(
        {"pg_name": "<i>pg", "seq": [0, 0], "index": 0, "rank": [0, 1], "skew_ms": 1.0}
    )
    assert list(figures.skew_heatmap(skew).data[0].x) == ["&lt;i&gt;pg:0"]
    bars = figures.stacked_columns_figure(
        pd.DataFrame({"rank": ["<b>0"], "<i>ms": [1.0]}), "rank", ["<i>ms"], "t"
    )
    assert list(bars.data[0].x) == ["&lt;b&gt;0"] and bars.data[0].name == "&lt;i&gt;ms"


def test_a_gpu_trace_without_device_properties_is_not_called_cpu_only(result) -> None:
    """Probe 31h, D8: HTA's sampled 128-rank set has NCCL kernels but no deviceProperties:
    the facts line said "CPU only" above a "GPU idle" verdict."""
    from gpudiag.report import overview

    assert result.run.has_gpu_trace and not result.run.devices
    assert overview.devices_text(result.run) == "GPU (model not in the trace)"
    assert "GPU (model not in the trace)" in render_html([result])
    cpu = analyze(sample_runs_dir() / "ddp2_healthy")
    assert overview.devices_text(cpu.run) == "cpu"  # the run's own device list
