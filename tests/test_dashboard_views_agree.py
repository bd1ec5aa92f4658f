"""Probe 31j (issue 31, "the answer on the first screen"): every view says the same thing
in the same order with the same numbers. Recorded runs only (tests/fixtures, sample_runs,
../shared/traces read in place); the dashboard through Streamlit's AppTest.
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.report import jsonout  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.terminal import print_report  # noqa: E402

APP = REPO / "dashboards" / "app.py"
FIXTURES = REPO / "tests" / "fixtures"
DATA_STRAGGLER = FIXTURES / "busy_host" / "lightning_rank1_data_40ms_3_hogs"


def _app(monkeypatch: pytest.MonkeyPatch, *runs: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *map(str, runs)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _plain(text: str) -> str:
    return text.replace("\\", "")


def test_a_cause_is_listed_above_its_effect_in_every_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D1: rank 1's data wait (41.0 ms) makes it a straggler whose cost (46.6 ms) is a
    little larger. JSON listed the cause first; the terminal, HTML and dashboard sorted
    again by cost and put the straggler first, so the first-screen verdict named the
    effect. One order everywhere: the JSON's."""
    result = analyze(DATA_STRAGGLER)
    buf = io.StringIO()
    jsonout.write_results([result], buf)
    payload = json.loads(buf.getvalue())
    payload = payload[0] if isinstance(payload, list) else payload
    want = [f["kind"] for f in payload["findings"]]
    assert want[:2] == ["dataloader_stall", "straggler"]
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=200, color_system=None))
    assert re.findall(r"\d+\. \[\w+\] (\w+)", buf.getvalue()) == want
    assert re.findall(r"</span> <b>(\w+)</b>", render_html([result])) == want
    at = _app(monkeypatch, DATA_STRAGGLER)
    assert [_plain(k) for k in at.table[0].value["kind"]] == want
    verdict = _plain(at.error[0].value)
    assert "straggler" not in verdict.split(".")[0].lower(), verdict


SEGMENT = re.compile(
    r'data-component="(?P<key>\w+)" data-rank="(?P<rank>\d+)" data-ms="(?P<ms>[0-9.]+)"'
)


def _svg(at: AppTest) -> str:
    (svg,) = [m.value for m in at.markdown if "gpudiag-rank-parts" in m.value]
    return svg


def test_the_straggler_verdicts_number_is_a_chart_column_and_names_whom_they_wait_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D2: the verdict said 39.05 ms/step (median over every matched step), the chart's
    wait on the other ranks is 39.25 (mean over the 3 profiled steps): within the old 5 %
    tolerance, so nothing tied them. And the legend said "waiting for late peers" where
    the evidence names the one rank everyone waits for. Now the verdict gives the chart's
    column beside its own number, each with its window, and the wait is named for rank 2
    (rank 2's own wait, if any, is not called a wait for itself)."""
    run = REPO / "sample_runs" / "ddp4_straggler"
    at = _app(monkeypatch, run)
    svg = _svg(at)
    waits = [
        float(m["ms"])
        for m in SEGMENT.finditer(svg)
        if m["key"] == "comm_wait" and m["rank"] != "2"
    ]
    chart = f"{sum(waits) / len(waits):.2f} ms"
    verdict = _plain(at.error[0].value)
    cost = next(f for f in analyze(run).findings if f.kind == "straggler").cost_ms_per_step
    assert f"wait for it {cost:.2f} ms/step, median over 14 matched steps" in verdict
    assert (
        f"'waiting for rank 2 (late peer)' on the other ranks is the mean of ranks 0, 1 and "
        f"3's bars, {chart} (" in verdict
    )
    for m in SEGMENT.finditer(svg):  # each bar it averages, as the chart draws it
        if m["key"] == "comm_wait" and m["rank"] != "2":
            assert f"rank {m['rank']} {float(m['ms']):.2f} ms" in verdict
    assert "each bar the mean over its 3 profiled steps" in verdict
    assert "waiting for rank 2 (late peer)" in svg and "rank 2 · waiting for rank 2" not in svg


def test_a_wait_for_several_late_ranks_keeps_the_general_name(shared_traces: Path) -> None:
    """Megatron TP8: ranks 0 and 6 come late, and the others' wait is for whichever came
    last (the straggler's net cost 145.34 ms against a chart wait of about 422 ms): no
    single rank is named."""
    from gpudiag.report import overview

    parts = overview.rank_parts(analyze(shared_traces / "astrasim_megatron_tp8"))
    assert parts.labels["comm_wait"] == "waiting for late peers" and not parts.waited


def test_overlap_has_one_meaning_per_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """D5: the exposed_communication evidence's "overlap fraction" (overlapped / overlapped
    + transfer, waits left out: 18.4 % here) and the per-rank "overlap % of comm" (HTA's:
    the communication's time beside compute, waits included: a few %) were both called
    overlap. Each is now named for what it counts, in the terminal, HTML and dashboard."""
    run = REPO / "sample_runs" / "ddp4_straggler"
    result = analyze(run)
    exposed = next(f for f in result.findings if f.kind == "exposed_communication")
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    views = {"terminal": buf.getvalue(), "html": render_html([result])}
    for name, text in views.items():
        assert "overlap fraction" not in text, name
        assert "overlapped share of the transfer" in text, name
        assert "waits included" in text, name
    at = _app(monkeypatch, run)
    headers = [c for d in at.dataframe for c in d.value.columns] + [
        c for t in at.table for c in t.value.columns
    ]
    assert "overlap % of comm, waits included" in headers
    assert exposed.evidence["overlap_fraction"] > 0.1  # not the table's few %
    page = " ".join(_plain(m.value) for m in [*at.markdown, *at.caption])
    assert "overlap fraction" not in page


def test_a_part_of_a_whole_in_evidence_carries_the_wholes_unit() -> None:
    """D10: the straggler's ``extra_ms_per_step`` (where its extra time goes, by part)
    read "extra: data: 0.00; starved: 0.00; compute: 1.12; blocked: 52.37", no unit."""
    from gpudiag.report import overview

    result = analyze(FIXTURES / "busy_host" / "rank1_sleeps_50ms")
    straggler = next(f for f in result.findings if f.kind == "straggler")
    (line,) = [x for x in overview.evidence_lines(straggler.evidence) if x.startswith("extra:")]
    assert re.fullmatch(r"extra: (\w+: [0-9.]+ ms/step; )+\w+: [0-9.]+ ms/step", line), line


def test_gpu_idle_has_one_number_per_label_and_its_projection(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """D6, Megatron TP8: the finding's GPU idle (69.59 ms/step, data loading left out) and
    the GPU metrics' "GPU idle" (75.28 mean, data loading included) had one label; the
    evidence's 87.8 % busy beside the title's 11.1 % idle did not add up; and the verdict's
    "about 69.59 ms/step back" had no What-if row. Each number now has its own label, and
    the What-if table projects the verdict's saving."""
    from gpudiag.report import overview

    run = shared_traces / "astrasim_megatron_tp8"
    result = analyze(run)
    finding = next(f for f in result.findings if f.kind == "gpu_idle")
    (row,) = [p for p in result.whatif if p.scenario == "gpu_idle_filled"]
    assert row.saving_ms == pytest.approx(finding.cost_ms_per_step)
    lines = overview.evidence_lines(finding.evidence)
    total = finding.evidence["gpu_idle_total_ms_per_step"]
    assert f"GPU idle, data loading included (mean over ranks): {total:.2f} ms/step" in lines
    assert any(x.startswith("GPU busy (any kernel, copy or collective; all ranks") for x in lines)
    assert "outside data loading" in overview.verdict(result).headline
    at = _app(monkeypatch, run)
    whatif = next(t.value for t in at.table if "projected ms" in t.value.columns)
    assert "gpu_idle_filled" in [_plain(s) for s in whatif["fix"]]
    at.sidebar.radio(key="view").set_value("GPU metrics").run()
    header = "GPU idle, data loading included ms/step"
    busy = next(d.value for d in at.dataframe if header in d.value.columns)
    assert busy[header].astype(float).mean() == pytest.approx(total, abs=0.01)
    assert not any("GPU idle ms/step" in d.value.columns for d in at.dataframe)


def test_the_timeline_names_its_whole_collectives_and_keeps_its_legend_clear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D3: the Timeline drew rank 0's 40 ms wait for rank 2 as one "communication" bar in a
    colour no other chart uses, under a caption saying every part has its colour there
    too; its legend's first entry sat under the modebar (top right). The lane now says
    what it holds (each collective whole: waiting + transfer), the caption says it has
    its own colour, and the legend starts at the left."""
    from gpudiag.report import colours, figures

    run = REPO / "sample_runs" / "ddp4_straggler"
    at = _app(monkeypatch, run)
    caption = " ".join(_plain(c.value) for c in at.caption)
    assert "each collective whole (waiting + transfer, overlapped or not)" in caption
    at.sidebar.radio(key="view").set_value("Timeline").run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    comm = [t for t in spec["data"] if t.get("name") == figures.TIMELINE_COMMUNICATION]
    assert comm and comm[0]["line"]["color"] == colours.COMPONENT_COLORS["communication"]
    assert not any(t.get("name") == "communication" for t in spec["data"])
    legend = spec["layout"]["legend"]
    assert legend["xanchor"] == "left" and legend["x"] == 0


def _compare(monkeypatch: pytest.MonkeyPatch, a: Path, b: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(a), str(b)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    labels = list(at.sidebar.selectbox[0].options)
    (la,) = [x for x in labels if x.endswith(a.name)]
    (lb,) = [x for x in labels if x.endswith(b.name)]
    at.query_params.update(run=la, view="Compare", partner=lb)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.header[0].value.startswith("Compare · Run A: ")  # the run named (probe 31m)
    return at


def test_compare_warns_of_another_device_or_job(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """D4: DLRM on V100 against Megatron on A100 (trace sets: no script) had no warning;
    a CPU run against a GPU set was warned of world size and backend only, and its merged
    parts read "idle (no range / GPU idle, host idle)"."""
    dlrm, megatron = shared_traces / "param_dlrm_ddp8", shared_traces / "astrasim_megatron_tp8"
    at = _compare(monkeypatch, dlrm, megatron)
    warnings = [_plain(w.value) for w in at.warning]
    assert any(w.startswith("Devices differ: A Tesla V100") for w in warnings), warnings
    assert any(w.startswith("Neither run names a script") for w in warnings), warnings
    at = _compare(monkeypatch, REPO / "sample_runs" / "ddp4_straggler", dlrm)
    warnings = [_plain(w.value) for w in at.warning]
    assert any(w.startswith("Devices differ: A CPU only, B Tesla V100") for w in warnings)
    assert any(w.startswith("B names no script") for w in warnings), warnings
    metrics = " ".join(
        str(m) for d in at.dataframe if "metric" in d.value.columns for m in d.value["metric"]
    )
    assert "no range / GPU idle" not in metrics and "no op / GPU idle" not in metrics
    assert "(CPU run)" in metrics and "(GPU run)" in metrics


def test_compare_names_the_rows_that_moved_as_its_table_and_its_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D10: "Components that moved: exposed communication +N ms" named a row the table
    splits into waiting and transfer, and said no window beside a steady step row over
    every recorded step."""
    at = _compare(
        monkeypatch, REPO / "sample_runs" / "ddp4_straggler", REPO / "sample_runs" / "ddp2_healthy"
    )
    (line,) = [_plain(m.value) for m in at.markdown if "Components that moved" in m.value]
    table = next(d.value for d in at.dataframe if "metric" in d.value.columns)
    rows = [str(m).removesuffix(" ms/step") for m in table["metric"]]
    named = line.split("): ", 1)[1]
    for part in named.split("; "):
        assert part.rsplit(" ", 2)[0] in rows, (part, rows)
    assert not any(p.startswith("exposed communication") for p in named.split("; "))
    assert "waiting for late peers" in named  # the split row the table has
    assert "the mean over ranks and each run's analysed steps" in line


def test_the_all_reduce_lanes_tell_eight_ranks_apart(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """D9, DLRM's 8 ranks: ranks 3, 4 and 5 shared one hatching in three greys (told apart
    by shade alone, at 60 % opacity), and lane #0's top bar was cut at the plot's edge.
    Each of the 8 ranks now has a pattern of its own, and the lanes have room above."""
    at = _app(monkeypatch, shared_traces / "param_dlrm_ddp8")
    at.sidebar.radio(key="view").set_value("Communication").run()
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    (lanes,) = [s for s in specs if "one lane per call" in str(s["layout"].get("title"))]
    ranks = [t for t in lanes["data"] if str(t.get("name", "")).startswith("rank ")]
    assert len(ranks) == 8
    patterns = [t["marker"].get("pattern", {}).get("shape", "") for t in ranks]
    assert len(set(patterns)) == 8, patterns
    low, high = lanes["layout"]["yaxis"]["range"]
    shown = len(lanes["layout"]["yaxis"]["categoryarray"])
    assert low <= -0.75 and high >= shown - 0.25
