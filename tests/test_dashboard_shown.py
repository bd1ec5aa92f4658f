"""A chart or table that shows part of its data says so, with the right numbers (probe of
issue 31, E): the Communication view's lane chart of all-reduces drew 64 of a Megatron
TP step's 84 calls without a word. Driven with Streamlit's AppTest on a public GPU trace
set (read in place) and checked against `gpudiag.analysis.analyze` directly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.report import figures  # noqa: E402

APP = REPO / "dashboards" / "app.py"


def _communication(monkeypatch: pytest.MonkeyPatch, run: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(run)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params["view"] = "Communication"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _lane_chart(at: AppTest) -> dict:
    return next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if "one lane per call" in json.loads(c.proto.spec)["layout"]["title"]["text"]
    )


def test_lane_chart_of_calls_says_how_many_it_shows(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """Megatron TP8: 84 all-reduces per step and rank. Drawn 64 lanes at once, 8 ranks
    overlaid, lanes and labels overlapped (probe N9): the chart draws ten lanes at a time,
    each rank its own bar in a lane, and says which ten; a select pages through them;
    the table lists every call."""
    run = shared_traces / "astrasim_megatron_tp8"
    calls = analyze(run).buckets.frame()
    per_step = calls.groupby(["rank", "step"]).size()
    assert set(per_step) == {84}  # the trace's own count, not the chart's
    ranks = calls["rank"].nunique()
    at = _communication(monkeypatch, run)
    want = "showing calls #0–#9 of 84 per step (10 at a time)"
    captions = [c.value.replace("\\", "") for c in at.caption]
    assert any(c.startswith(want.capitalize()) for c in captions), captions
    spec = _lane_chart(at)
    assert want in spec["layout"]["title"]["text"]
    assert spec["layout"]["barmode"] == "group"  # ranks side by side, not drawn over
    assert spec["layout"]["yaxis"]["type"] == "category"  # lanes named #0..#9, top down
    assert len(spec["data"]) == ranks == 8
    lanes = {y for trace in spec["data"] for y in trace["y"]}
    assert lanes == {f"#{k}" for k in range(10)}
    bars = sum(len(trace["y"]) for trace in spec["data"])
    assert bars == int((calls["bucket"] < 10).sum()) == 10 * len(per_step)
    assert spec["layout"]["height"] >= 10 * 8 * 6  # every rank's bar at least 6 px
    page = at.selectbox(key="bucket_page")
    assert len(page.options) == 9  # 84 calls: #0-#9 ... #80-#83
    page.set_value(80).run()
    spec = _lane_chart(at)
    assert {y for trace in spec["data"] for y in trace["y"]} == {f"#{k}" for k in range(80, 84)}
    assert "showing calls #80–#83 of 84 per step" in spec["layout"]["title"]["text"]
    table = next(d.value for d in at.dataframe if "call (issue order)" in d.value.columns)
    assert len(table) == len(calls) == 84 * len(per_step)


def test_a_chart_that_shows_everything_says_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped 4-rank run: 2 calls per step, all drawn, no "showing" caption."""
    at = _communication(monkeypatch, REPO / "sample_runs" / "ddp4_straggler")
    assert not [c.value for c in at.caption if "showing" in c.value.lower()]
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert "All-reduces per step, one lane per call" in titles


def test_skew_heatmap_and_step_bands_say_what_they_leave_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other capped figures: the skew heatmap's first 300 collectives, the
    timeline's first shaded steps (200; 5 here, to keep the test quick)."""
    skew = pd.DataFrame(
        {
            "pg_name": "0",
            "seq": [s for s in range(310) for _ in range(2)],
            "index": 0,
            "rank": [0, 1] * 310,
            "skew_ms": 1.0,
        }
    )
    assert figures.skew_columns(skew) == 310
    fig = figures.skew_heatmap(skew)
    title = fig.layout.title.text
    assert "showing 300 of 310 collectives" in title
    # the rule on a line of its own under the title, with room for it: on one line it ran
    # past the chart's right edge and was cut (probe 31f, D9; in Chromium at 1440 px the
    # two lines end at 822 px of a 1320 px chart on a 2,800-collective run)
    first, second = title.split("<br>")
    assert first == figures.SKEW_TITLE and len(first) <= 70
    assert second == f"<sup>{figures.skew_shown_text(300, 310)}</sup>"
    assert fig.layout.margin.t >= 80
    assert "showing" not in figures.skew_heatmap(skew[skew["seq"] < 300]).layout.title.text
    monkeypatch.setattr(figures, "MAX_STEP_BANDS", 5)
    steps = pd.DataFrame({"rank": 0, "lane": "step", "start_ms": range(7), "end_ms": range(1, 8)})
    fig = figures.timeline_figure(steps)
    assert fig.layout.title.text == "Timeline (steps shaded: the first 5 of 7)"
    assert len(fig.layout.shapes) == 5
    assert "shaded" not in figures.timeline_figure(steps.head(5)).layout.title.text


def test_megatron_all_reduces_are_shown_as_calls_not_ddp_buckets(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """Issue 31, D: the Communication view names a Megatron TP run's all-reduces as the
    analysis does (RunInfo.allreduce_label), with no DDP advice; a DDP run's stay buckets."""
    at = _communication(monkeypatch, shared_traces / "astrasim_megatron_tp8")
    heads = [h.value.replace("\\", "") for h in at.subheader]
    assert "All-reduces per step, in issue order: all-reduce calls" in heads, heads
    assert not [h for h in heads if "bucket" in h.lower()], heads
    table = next(d.value for d in at.dataframe if "call (issue order)" in d.value.columns)
    assert "bucket (issue order)" not in table.columns
    at.sidebar.radio(key="view").set_value("Overview").run()
    text = " ".join(
        e.value
        for e in [*at.markdown, *at.table, *at.error, *at.warning, *at.info]
        if isinstance(e.value, str)
    ).replace("\\", "")
    assert "bucket_cap_mb" not in text and "no_sync" not in text
    ddp = _communication(monkeypatch, REPO / "sample_runs" / "ddp4_straggler")
    heads = [h.value.replace("\\", "") for h in ddp.subheader]
    assert "All-reduces per step, in issue order: DDP gradient buckets" in heads, heads
    assert any("bucket (issue order)" in d.value.columns for d in ddp.dataframe)


def test_skew_hover_says_ms_after_the_first_to_arrive() -> None:
    """Probe N3: a skew of 0 read as "arrived: 0", a count. The hover names the value as
    milliseconds after the first rank to arrive, 0 being the first."""
    skew = pd.DataFrame(
        {"pg_name": "0", "seq": [1, 1], "index": 0, "rank": [0, 1], "skew_ms": [0.0, 4.5]}
    )
    trace = figures.skew_heatmap(skew).data[0]
    assert "arrived %{z:.2f} ms after the first rank to arrive" in trace.hovertemplate
    assert figures.SKEW_FIRST in trace.hovertemplate
    assert "ms" in trace.colorbar.title.text
