"""The answer on the first screen (issue 31): the Overview's step time, verdict line and
per-rank chart, on the recorded straggler sample and public GPU trace sets, with the
real Streamlit AppTest; the labels agree across the finding, the chart and the tables;
the findings are in one order in every report. Marked `browser`: the first screen at
1440x900 in headless Chromium, and the live marker once a run ends.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ and tests/browser/ are not installed packages

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.analysis.result import AnalysisResult  # noqa: E402
from gpudiag.report import numbers, overview  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.terminal import print_report  # noqa: E402
from tests.dashboard_shown import table_with  # noqa: E402

APP = REPO / "dashboards" / "app.py"
STRAGGLER = REPO / "sample_runs" / "ddp4_straggler"
SEGMENT = re.compile(
    r'data-component="(?P<key>\w+)" data-rank="(?P<rank>\d+)" data-ms="(?P<ms>[0-9.]+)"'
)


@pytest.fixture(scope="module")
def straggler() -> AnalysisResult:
    return analyze(STRAGGLER)


def _app(monkeypatch: pytest.MonkeyPatch, run: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(run)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _svg(at: AppTest) -> str:
    found = [m.value for m in at.markdown if "gpudiag-rank-parts" in m.value]
    assert len(found) == 1
    return found[0]


def _segments(svg: str) -> dict[tuple[int, str], float]:
    return {(int(m["rank"]), m["key"]): float(m["ms"]) for m in SEGMENT.finditer(svg)}


def _plain(text: str) -> str:
    return text.replace("\\", "")


def test_first_screen_is_step_time_verdict_and_chart(
    monkeypatch: pytest.MonkeyPatch, straggler: AnalysisResult
) -> None:
    at = _app(monkeypatch, STRAGGLER)
    # the step time, the verdict and the chart come before the findings' table
    names = [type(e).__name__ for e in at.main]
    assert names.index("Metric") < names.index("Markdown") < names.index("Table")
    metric = next(m for m in at.metric if m.label == "Step time")
    assert _plain(metric.value) == overview.step_time(straggler)[1]
    verdict = _plain(at.error[0].value)
    assert "Rank 2 is the straggler" in verdict
    top = overview.ordered_findings(straggler.findings)[0]
    assert top.kind == "straggler" and top.ranks == [2]
    assert f"{top.cost_ms_per_step:.2f} ms/step" in verdict and "Fix:" in verdict
    assert at.button[0].label.startswith("Evidence: arrival skew")
    svg = _svg(at)
    # exposed communication split into the wait and the transfer; the wait names rank 2,
    # whom the evidence says every other rank waits for (no other late rank: probe 31j,
    # D2), and rank 2's own wait, if any, is not called a wait for itself ("waiting for
    # rank 7" was drawn on rank 7's own bar: fourth browser probe)
    assert "waiting for rank 2 (late peer)" in svg
    assert "transfer (exposed communication)" in svg
    assert "rank 2 · waiting for rank 2" not in svg
    assert 'class="named-rank"' in svg and svg.count('class="named-rank"') == 1
    assert re.search(r'font-weight="700">rank 2 ◀</text>', svg)
    # the evidence link opens the Communication view, with the skew heatmap first
    at.button[0].click().run()
    assert at.header[0].value.startswith("Communication")


def test_chart_columns_are_the_analysis_numbers(
    monkeypatch: pytest.MonkeyPatch, straggler: AnalysisResult
) -> None:
    """Label agreement: each segment is a column of the per-rank table; waiting plus
    transfer is that rank's exposed communication; the wait is the exposed-communication
    finding's per-rank wait."""
    segments = _segments(_svg(_app(monkeypatch, STRAGGLER)))
    exposed = next(f for f in straggler.findings if f.kind == "exposed_communication")
    waits = exposed.evidence["per_rank_waiting_for_peers_ms"]
    for row in straggler.ranks.itertuples(index=False):
        rank = int(row.rank)
        wait = segments.get((rank, "comm_wait"), 0.0)
        transfer = segments.get((rank, "comm_transfer"), 0.0)
        assert wait == pytest.approx(min(waits[str(rank)], row.comm_exposed), abs=1e-3)
        assert wait + transfer == pytest.approx(row.comm_exposed, abs=1e-3)
        for key in ("compute", "comm_overlapped", "data_loading", "other", "idle"):
            assert segments.get((rank, key), 0.0) == pytest.approx(getattr(row, key), abs=1e-3)
        drawn = sum(v for (r, _), v in segments.items() if r == rank)
        assert drawn == pytest.approx(row.step_ms_mean, rel=1e-3)
    # rank 2 waits for nobody; the others wait for it most of their exposed time
    assert segments.get((2, "comm_wait"), 0.0) == 0.0
    assert all(segments[(r, "comm_wait")] > 30 for r in (0, 1, 3))


@pytest.mark.parametrize(
    "run",
    [
        STRAGGLER,
        REPO / "tests" / "fixtures" / "busy_host" / "rank1_sleeps_50ms",
        REPO / "tests" / "fixtures" / "busy_host" / "healthy_rank0_late",
    ],
    ids=lambda p: p.name,
)
def test_the_chart_adds_up_to_the_findings_wait_and_transfer(run: Path) -> None:
    """The chart's per-rank wait and transfer, averaged over ranks, are the finding's
    numbers (in the profiled window's terms, as the chart is). Before, the chart drew the
    measured waits while the finding set a straggler's larger share apart: 28.80 / 9.19 ms
    drawn, 29.29 / 8.70 ms said (browser probe of issue 31)."""
    result = analyze(run)
    exposed = next(f for f in result.findings if f.kind == "exposed_communication")
    parts = overview.rank_parts(result)
    assert parts.split
    scale = exposed.evidence.get("window_scale", 1.0)
    transfer = exposed.evidence.get("window_transfer_ms", exposed.evidence["transfer_ms"])
    waiting = exposed.evidence["waiting_for_peers_ms"] / scale
    assert parts.frame["comm_wait"].mean() == pytest.approx(waiting, abs=2e-3)
    assert parts.frame["comm_transfer"].mean() == pytest.approx(transfer, abs=2e-3)


@pytest.mark.parametrize("trace_set", ["astrasim_megatron_tp8", "param_dlrm_ddp8"])
def test_gpu_idle_finding_adds_up_to_the_chart(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path, trace_set: str
) -> None:
    """On a GPU run "GPU idle" is one thing: no kernel on the device. The gpu_idle
    finding's ms/step is the mean over ranks of the chart's two GPU-idle segments (host
    busy, host idle), the per-rank table names those columns so, and the GPU metrics
    view's idle per rank adds the chart's data loading (GPU idle) to it."""
    run = shared_traces / trace_set
    result = analyze(run)
    finding = next(f for f in result.findings if f.kind == "gpu_idle")
    at = _app(monkeypatch, run)
    segments = _segments(_svg(at))
    ranks = sorted({r for r, _ in segments})
    idle = [segments.get((r, "other"), 0.0) + segments.get((r, "idle"), 0.0) for r in ranks]
    chart_mean = sum(idle) / len(idle)
    assert finding.cost_ms_per_step == pytest.approx(chart_mean, abs=0.01)
    svg = _svg(at)
    assert "GPU idle · host busy" in svg and "GPU idle · host idle" in svg
    assert "no op, inside a recorded range" not in svg  # the CPU runs' name for the same column
    verdicts = [_plain(e.value) for e in [*at.error, *at.warning, *at.info]]
    if overview.ordered_findings(result.findings)[0].kind == "gpu_idle":
        assert any(f"GPU idle {finding.cost_ms_per_step:.2f} ms/step" in v for v in verdicts)
    table = table_with(at, "GPU idle · host busy ms/step")
    assert "GPU idle · host idle ms/step" in table.columns
    at.sidebar.radio(key="view").set_value("GPU metrics").run()
    busy = next(
        d.value
        for d in at.dataframe
        if "GPU idle, data loading included ms/step" in d.value.columns
    )
    for rank, want in zip(ranks, idle, strict=True):
        want += segments.get((rank, "data_loading"), 0.0)
        got = float(
            busy.loc[busy["rank"] == rank, "GPU idle, data loading included ms/step"].iloc[0]
        )
        assert got == pytest.approx(want, abs=0.05), rank


def test_findings_in_one_order_everywhere(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """Severity, then cost: on Megatron a medium gpu_idle (70 ms) is listed above a low
    straggler (145 ms) in the terminal, the HTML report and the dashboard alike."""
    run = shared_traces / "astrasim_megatron_tp8"
    result = analyze(run)
    want = [f.kind for f in overview.ordered_findings(result.findings)]
    severities = [f.severity for f in overview.ordered_findings(result.findings)]
    assert severities == sorted(severities, key=["high", "medium", "low"].index)
    assert want.index("gpu_idle") < want.index("straggler")
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=200, color_system=None))
    terminal = re.findall(r"\d+\. \[\w+\] (\w+)", buf.getvalue())
    assert terminal == want
    html = render_html([result])
    html_kinds = re.findall(r"</span> <b>(\w+)</b>", html)
    assert html_kinds == want
    at = _app(monkeypatch, run)
    assert [_plain(k) for k in at.table[0].value["kind"]] == want


def test_terminal_evidence_reads_as_words(straggler: AnalysisResult) -> None:
    buf = io.StringIO()
    print_report(straggler, console=Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "{'" not in text and "'}" not in text  # no Python dict repr
    cost = next(f for f in straggler.findings if f.kind == "straggler").cost_ms_per_step
    assert f"net wait: rank 2: {cost:.2f} ms/step" in text
    assert f"straggler  {cost:.2f} ms/step  rank 2 " in text
    assert "ranks 2" not in text
    assert "all 4 ranks" in text  # every rank, as the verdict says it (probe 31m)
    assert "nan" not in text.lower().split() and " - " not in text


# --------------------------------------------------------------------------- browser


@pytest.mark.browser
def test_browser_first_chart_is_above_the_fold(tmp_path: Path) -> None:
    """At 1440x900, the verdict and the whole per-rank chart are visible without
    scrolling, the named rank outlined; every column of the per-rank table is in view."""
    from tests.browser import dashboard as browser

    server = browser.Dashboard([STRAGGLER])
    try:
        server.wait_ready()
        with browser.browser() as page:
            page.set_viewport_size({"width": 1440, "height": 900})
            page.goto(browser.view_url(server.url, "ddp4_straggler", "Overview"))
            chart = page.locator(browser.FIRST_CHART).first
            chart.wait_for(timeout=120_000)
            browser.wait_idle(page)
            box = chart.bounding_box()
            assert box is not None and box["height"] > 200
            assert box["y"] + box["height"] <= 900, box
            verdict = page.get_by_text("Rank 2 is the straggler", exact=False).first
            vbox = verdict.bounding_box()
            assert vbox is not None and vbox["y"] + vbox["height"] <= 900
            assert page.locator("svg.gpudiag-rank-parts rect.named-rank").count() == 1
            assert page.locator(browser.EXCEPTION).count() == 0
            page.screenshot(path=str(tmp_path / "first_screen.png"))
            _every_per_rank_column_in_view(page)
    finally:
        server.close()


def _every_per_rank_column_in_view(page: Any) -> None:
    """Probe 31g, defect 3: at 1440 px the Overview's per-rank table showed 8 of its 13
    columns, rank 2's 40.83 ms of data loading only after a sideways scroll. Every
    header cell now lies inside the page, and nothing in the table scrolls sideways."""
    table = page.locator('[data-testid="stTable"]', has_text="data loading ms/step").first
    table.scroll_into_view_if_needed()
    headers = table.locator("th").all()
    texts = [h.inner_text() for h in headers]
    assert len(texts) == 13 and "overlap % of comm, waits included" in texts, texts
    for header in headers:
        box = header.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1440, (header.inner_text(), box)
    sideways = page.evaluate(
        """(el) => [...el.querySelectorAll('*')].some(
            (n) => n.scrollWidth > n.clientWidth + 1 &&
            ['auto', 'scroll'].includes(getComputedStyle(n).overflowX))""",
        table.element_handle(),
    )
    assert not sideways
    assert "40.83" in table.inner_text()  # rank 2's time in a recorded range


@pytest.mark.browser
def test_browser_live_marker_goes_when_the_run_ends(tmp_path: Path) -> None:
    """A run shown live (its launcher: a `sleep` this test starts) loses its "● (live)"
    in the run select as soon as the launcher is gone, without a reload."""
    from bench.dashboard_shots import live_copy
    from tests.browser import dashboard as browser

    root = tmp_path / "live"
    root.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"])
    server = None
    try:
        live_copy(root, STRAGGLER, sleeper.pid)
        server = browser.Dashboard([root])
        server.wait_ready()
        with browser.browser() as page:
            page.goto(browser.view_url(server.url, "live/live_run", "Overview"))
            page.wait_for_selector('h2:has-text("Live")', timeout=120_000)
            select = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"] input')
            assert select.first.input_value() == "● live/live_run (live)"
            page.evaluate("window.__gpudiagMarker = 'same page'")
            sleeper.terminate()
            sleeper.wait()
            page.wait_for_selector('h2:has-text("Overview")', timeout=120_000)
            browser.wait_idle(page)
            deadline = time.monotonic() + 10
            shown = [i.input_value() for i in select.all()]
            while shown != ["live/live_run"]:  # one select, without the marker
                assert time.monotonic() < deadline, shown
                time.sleep(0.25)
                shown = [i.input_value() for i in select.all()]
            assert page.evaluate("window.__gpudiagMarker") == "same page"  # no reload
    finally:
        if sleeper.poll() is None:
            sleeper.terminate()
            sleeper.wait()
        if server is not None:
            server.close()
        shutil.rmtree(root, ignore_errors=True)


def test_one_number_format_everywhere(
    monkeypatch: pytest.MonkeyPatch, straggler: AnalysisResult
) -> None:
    """A cost reads the same (two decimals) in the terminal, the HTML report and the
    dashboard; a missing value (the CPU run's unknown link peak) is the same dash."""
    exposed = next(f for f in straggler.findings if f.kind == "exposed_communication")
    cost = f"{exposed.cost_ms_per_step:.2f}"
    buf = io.StringIO()
    print_report(straggler, console=Console(file=buf, width=200, color_system=None))
    terminal = buf.getvalue()
    html = render_html([straggler])
    at = _app(monkeypatch, STRAGGLER)
    table = at.table[0].value
    shown = table.loc[table["kind"] == "exposed\\_communication", "cost ms/step"].iloc[0]
    assert _plain(shown) == cost
    assert f"exposed_communication  {cost} ms/step" in terminal
    assert f"<b>exposed_communication</b> — {cost} ms/step" in html
    # the link peak is unknown on gloo: the dash, never nan / None / "-"
    assert straggler.collective_summary["peak_gbs"].isna().all()
    collectives = terminal[terminal.index("Collectives") :]
    assert " – " in collectives
    assert "nan" not in collectives.lower() and "None" not in collectives
    assert "<td>–</td>" in html and "<td>nan</td>" not in html
    at.sidebar.radio(key="view").set_value("Communication").run()
    frame = next(d for d in at.dataframe if "link peak GB/s" in d.value.columns)
    assert frame.value["link peak GB/s"].tolist() == ["–"]


_SLEEPY_LOOP = """
import time, torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(10):
    loss = model(torch.randn(32, 64)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.04)  # in the loop, outside any recorded range
"""


def test_a_sleep_outside_any_range_is_drawn_under_one_name_everywhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sleep in the loop, outside every recorded range, is the breakdown's `idle`; the
    chart called that "idle (nothing running)" and said "sleeps" of the other column
    (browser probe of issue 31), and the terminal, the tables and Compare had their own
    names. One name per column, by what tells the two apart: a recorded range."""
    script = tmp_path / "sleepy.py"
    script.write_text(_SLEEPY_LOOP)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out),
         "--profile-steps", "3-6", str(script)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = analyze(out)
    row = result.ranks.iloc[0]
    assert row["idle"] > 30 > row["other"], result.ranks.to_dict("records")
    labels = overview.rank_parts(result).labels
    assert labels["idle"] == "no op, outside recorded ranges"
    assert labels["other"] == "no op, in a recorded range"
    svg = _svg(_app(monkeypatch, out))
    assert "no op, outside recorded ranges" in svg
    # one name per column in every view: the tables and the terminal say the same
    assert overview.rank_headers(result)["idle"] == "no op, outside recorded ranges ms/step"
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=300, color_system=None))
    assert "no op, outside recorded ranges ms" in buf.getvalue()


def test_whatif_percentages_have_one_format_in_every_view(straggler: AnalysisResult) -> None:
    """The HTML report printed "saving %" with 2 decimals, the dashboard and the terminal
    with 1 (browser probe of issue 31): one number, one format."""
    assert straggler.whatif
    page = render_html([straggler])
    section = page.split("What if: projected step time per fix", 1)[1].split("</table>", 1)[0]
    from gpudiag.report.terminal import whatif_table

    buf = io.StringIO()
    Console(file=buf, width=220, color_system=None).print(whatif_table(straggler.whatif))
    for p in straggler.whatif:
        assert f"<td>{p.saving_pct:.1f}</td>" in section, section
        assert f"({p.saving_pct:.1f} %)" in buf.getvalue()


def test_a_rank_lost_to_an_unreadable_trace_is_said_on_the_first_screen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With one rank's trace truncated, the first screen showed a confident verdict and a
    chart of 3 bars for a run of 4; the problems sat in a collapsed section at the bottom
    (browser probe of issue 31, I). The first screen and the HTML report now say which
    ranks the numbers leave out, above the verdict."""
    copy = tmp_path / "lost_rank3"
    shutil.copytree(STRAGGLER, copy)
    trace = copy / "traces" / "rank3.pt.trace.json.gz"
    trace.write_bytes(trace.read_bytes()[:200])
    at = _app(monkeypatch, copy)
    shown = [_plain(w.value) for w in at.warning]
    assert any("3 of the 4 ranks analysed: rank 3 is not in the numbers below" in w for w in shown)
    assert any("reading this run" in w for w in shown), shown
    # its exposed communication cannot be split: said under the chart (fourth probe, E)
    assert any("Exposed communication is drawn whole" in c.value for c in at.caption)
    page = render_html([analyze(copy)])
    assert page.index("Read with problems:") < page.index("class='verdict'")
    # a run read whole says nothing of the kind
    assert overview.reading_problems(analyze(STRAGGLER)) is None


def test_evidence_keeps_op_names_and_says_mib(
    shared_traces: Path, straggler: AnalysisResult
) -> None:
    """Browser probe of issue 31 (F, E): turning evidence keys into words rewrote the op
    names they hold ("aten::_local_scalar_dense" printed "aten:: local scalar dense"), and
    the bucket size, in MiB like the collectives table, was labelled MB."""
    dlrm = analyze(shared_traces / "param_dlrm_ddp8")
    sync = next(f for f in dlrm.findings if f.kind == "host_sync")
    lines = overview.evidence_lines(sync.evidence)
    assert any("aten::_local_scalar_dense: " in line for line in lines), lines
    bucket = next(f for f in straggler.findings if f.kind == "bucket_size")
    mib = bucket.evidence["mean_bucket_mib"]
    assert f"mean bucket: {mib:.2f} MiB" in overview.evidence_lines(bucket.evidence)


def test_the_chart_splits_exposed_communication_whatever_the_findings(
    shared_traces: Path,
) -> None:
    """The split into waiting for peers and transfer was drawn only when the run had an
    exposed_communication finding: a straggler run without one, and the DLRM GPU set,
    showed one red block in the colour that means "waiting" elsewhere (browser probe of
    issue 31, A). The per-rank table's comm_wait splits it in every run that measured it."""
    for run in (shared_traces / "param_dlrm_ddp8", REPO / "sample_runs" / "ddp2_healthy"):
        result = analyze(run)
        assert "comm_wait" in result.ranks, run
        parts = overview.rank_parts(result)
        assert parts.split and "comm_exposed" not in parts.frame
        exposed = result.ranks["comm_exposed"].astype(float).to_numpy()
        drawn = (parts.frame["comm_wait"] + parts.frame["comm_transfer"]).to_numpy()
        assert drawn == pytest.approx(exposed, abs=1e-9)
        found = next((f for f in result.findings if f.kind == "exposed_communication"), None)
        if found is not None:  # the finding's per-rank wait is the same number
            said = found.evidence["per_rank_waiting_for_peers_ms"]
            for rank, wait in zip(result.ranks["rank"], result.ranks["comm_wait"], strict=True):
                assert said[str(int(rank))] == pytest.approx(wait, abs=1e-3)
    # a run whose waits cannot be measured (1 of 8 ranks traced) is not split
    lone = analyze(shared_traces / "tracelens_mi300_ddp")
    assert "comm_wait" not in lone.ranks and not overview.rank_parts(lone).split


def test_a_finding_without_ranks_reads_the_same_everywhere(
    monkeypatch: pytest.MonkeyPatch, straggler: AnalysisResult
) -> None:
    """bucket_size names no rank: "all 4 ranks" (every analysed rank, as the verdict
    says it; probe 31n, D7) in the dashboard's Findings table, the terminal's finding
    header and the HTML report alike (probe 31, class J)."""
    from dashboards.views import findings_table

    empty = [f for f in straggler.findings if not f.ranks]
    assert empty, [f.kind for f in straggler.findings]
    table = findings_table(straggler.findings, straggler.run)
    for f in empty:
        assert table.loc[table["kind"] == f.kind, "ranks"].tolist() == ["all 4 ranks"]
    buf = io.StringIO()
    print_report(straggler, console=Console(file=buf, width=300, color_system=None))
    heads = [ln for ln in buf.getvalue().splitlines() if any(f.kind in ln for f in empty)]
    assert heads and all("all 4 ranks" in ln for ln in heads[:1]), heads
    html = render_html([straggler])
    for f in empty:
        assert re.search(rf"<b>{f.kind}</b> — [^<]* — all 4 ranks", html)
    at = _app(monkeypatch, STRAGGLER)
    shown = [str(t.value.to_dict()) for t in at.table]
    assert any("all 4 ranks" in s for s in shown) and not any("'all'" in s for s in shown)
    assert not any("all ranks" in s for s in shown)


def test_metric_charts_and_live_host_cpu_say_words_and_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU metrics chart titles are words with a unit, never a field name; the live
    page's host CPU says of what it is a percentage (probe 31, class G)."""
    import json
    from types import SimpleNamespace

    from dashboards import views
    from gpudiag.report import figures, tables

    for metric, unit in views.GPU_METRICS:
        assert "_" not in figures.metric_title(metric, unit)
    for metric, unit in views.HOST_METRICS:
        assert "_" not in figures.metric_title(metric, unit, host=True)
    monkeypatch.setattr(sys, "argv", ["app.py", str(STRAGGLER)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params["view"] = "GPU metrics"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    titles = [
        json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "")
        for c in at.get("plotly_chart")
    ]
    assert "host CPU busy (% of all cores)" in titles, titles
    assert not any(t.split(" (")[0] in ("cpu_percent", "mem_used", "proc_rss") for t in titles)
    host = SimpleNamespace(node=0, cpu_percent=20.0, mem_used=2**30, mem_total=2**31, gpus=[])
    frame = tables.live_node_frame(SimpleNamespace(nodes=[host]))  # type: ignore[arg-type]
    assert "util % (host: of all cores)" in frame.columns


def test_a_scaled_verdict_is_tied_to_the_charts_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31, B: the healthy sample's verdict costs its exposed transfer per steady
    step, scaled from the profiled steps the chart shows, so the verdict and the chart's
    transfer bars gave two numbers without a word. The first screen, the HTML report and
    the verdict say both, each equal to what it names."""
    run = REPO / "sample_runs" / "ddp2_healthy"
    result = analyze(run)
    verdict = overview.verdict(result)
    top = verdict.finding
    assert top is not None and top.kind == "exposed_communication"
    scale = top.evidence["window_scale"]
    assert scale < 1  # the profiled steps were slower than the steady step
    parts = overview.rank_parts(result)
    chart_transfer = float(parts.frame["comm_transfer"].mean())
    assert chart_transfer == pytest.approx(top.evidence["window_transfer_ms"], abs=0.006)
    assert top.cost_ms_per_step == pytest.approx(chart_transfer * scale, rel=0.01)
    note = verdict.chart_note
    assert f"there the transfer is {chart_transfer:.2f} ms per step" in note
    assert f"The verdict's {top.cost_ms_per_step:.2f} ms/step" in note
    assert f"{float(parts.frame['step_ms'].mean()):.2f} ms per step" in note
    at = _app(monkeypatch, run)
    assert any(_plain(c.value) == note for c in at.caption), [c.value for c in at.caption]
    html = render_html([result])
    assert f"there the transfer is {chart_transfer:.2f} ms per step" in html
    # a verdict measured as the chart is (the straggler sample's) is not scaled
    assert "scaled" not in overview.verdict(analyze(STRAGGLER)).chart_note


def test_a_larger_part_of_the_chart_than_the_verdict_is_said_and_tied(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """Issue 31 probe, D1 and D4: on the recorded Megatron set the verdict is GPU idle
    (69.59 ms/step) above a chart mostly "waiting for late peers" (mean 367 ms), whose
    straggler finding is low (one step) and said 145.34 ms where the chart drew ~430 ms
    on the other ranks, with nothing between. The note under the chart names the larger
    part, its finding and severity, and ties the straggler's net cost to the chart's wait;
    the same words in the dashboard and the HTML report."""
    run = shared_traces / "astrasim_megatron_tp8"
    result = analyze(run)
    verdict = overview.verdict(result)
    parts = overview.rank_parts(result)
    top = verdict.finding
    straggler = next(f for f in result.findings if f.kind == "straggler")
    assert top is not None and top.kind != "straggler" and straggler.severity == "low"
    wait_mean = float(parts.frame["comm_wait"].mean())
    assert wait_mean > 1.5 * top.cost_ms_per_step
    others = parts.frame[~parts.frame["rank"].isin(straggler.ranks)]
    note = verdict.chart_note
    assert f"'waiting for late peers', {wait_mean:.2f} ms per step" in note
    assert f"its finding (straggler) is low: {straggler.title}" in note
    assert (
        f"on the other ranks is the mean of {numbers.ranks(list(others['rank']))}'s bars, "
        f"{float(others['comm_wait'].mean()):.2f} ms (from "
    ) in note
    assert f"The straggler finding's {straggler.cost_ms_per_step:.2f} ms/step" in note
    at = _app(monkeypatch, run)
    assert any(_plain(c.value) == note for c in at.caption), [c.value for c in at.caption]
    assert _plain(note) in _plain(render_html([result])).replace("&#x27;", "'")
    # where the chart's largest part is the verdict's own (the straggler sample), nothing
    assert "largest part" not in overview.verdict(analyze(STRAGGLER)).chart_note


def test_a_straggler_whose_bar_is_not_the_tallest_is_said(
    monkeypatch: pytest.MonkeyPatch, straggler: AnalysisResult
) -> None:
    """Issue 31 probe, D3: on the straggler sample rank 3's bar (60.20 ms) is the tallest,
    the named rank 2's 57.05 ms, and nothing said why: the others' steps hold their wait
    for it. The note under the chart says so, in the dashboard and the HTML report."""
    parts = overview.rank_parts(straggler)
    steps = parts.frame.set_index("rank")["step_ms"].astype(float)
    top = overview.verdict(straggler).finding
    assert top is not None and top.kind == "straggler" and top.ranks == [2]
    tallest = int(steps.idxmax())
    assert tallest != 2
    note = overview.verdict(straggler).chart_note
    assert f"The tallest bar is rank {tallest}'s ({steps.max():.2f} ms), not rank 2's" in note
    assert "every rank's step is about as long" in note
    at = _app(monkeypatch, STRAGGLER)
    assert any(_plain(c.value) == note for c in at.caption), [c.value for c in at.caption]
    assert _plain(note) in _plain(render_html([straggler])).replace("&#x27;", "'")


def test_the_gpu_idle_verdict_names_the_ranks_analysed(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """hta_nccl_a100 lacks rank 1 of 2: the verdict said "on every rank" with only rank 0
    analysed (probe 31f, D6). It names rank 0, the same in the dashboard and the HTML; a
    run with every rank analysed says how many."""
    run = shared_traces / "hta_nccl_a100"
    result = analyze(run)
    assert result.run.traced_ranks == [0] and result.run.world_size == 2
    head = overview.verdict(result).headline
    assert head.startswith("GPU idle "), head
    assert "on rank 0:" in head and "every rank" not in head, head
    assert "mean over ranks" not in head, head  # one rank: no mean over ranks
    assert head in render_html([result])
    at = _app(monkeypatch, run)
    verdicts = [_plain(e.value) for e in [*at.error, *at.warning, *at.info]]
    assert any(head in v for v in verdicts), verdicts
    assert not any("every rank" in v for v in verdicts), verdicts
    full = overview.verdict(analyze(shared_traces / "param_dlrm_ddp8", workers=1)).headline
    assert "on all 8 ranks:" in full and "(the mean over all 8 ranks)" in full, full


def test_gpu_compute_has_one_name_per_quantity(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """hta_nccl_a100: the Overview's blue "GPU compute (kernels, copies)" was 36.87 ms/step,
    GPU metrics' "compute" 17.3 % of the same 3 steps (38.55 ms/step), and "any
    kernel/copy" read as the Overview's blue (probe 31f, D5). The windows are the same;
    the quantities are not: each has its own name in every view (and the GPU metrics
    one its own colour), and the page says how they differ."""
    import json

    from gpudiag.report import colours

    run = shared_traces / "hta_nccl_a100"
    result = analyze(run)
    busy = result.gpu.kernel_busy[0]
    row = result.ranks[result.ranks["rank"] == busy.rank].iloc[0]
    # the same window: the Overview's mean step is the GPU window over its steps
    assert busy.window_ms / busy.steps == pytest.approx(row["step_ms_mean"], abs=1e-6)
    kernels_ms = busy.compute_fraction * busy.window_ms / busy.steps
    assert abs(kernels_ms - row["compute"]) > 1.0  # 38.55 against 36.87: other quantities
    labels = overview.component_labels(True)
    assert labels["compute"] == overview.GPU_COMPUTE
    assert len({overview.GPU_COMPUTE, overview.GPU_BUSY, overview.COMPUTE_KERNELS}) == 3
    at = _app(monkeypatch, run)
    assert overview.GPU_COMPUTE in _svg(at)
    at.sidebar.radio(key="view").set_value("GPU metrics").run()
    assert not at.exception
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    named = {t["name"]: t["marker"]["color"] for t in chart}
    assert named == {
        overview.GPU_BUSY: colours.COMPONENT_COLORS["gpu_busy"],
        overview.COMPUTE_KERNELS: colours.COMPONENT_COLORS["compute_kernels"],
    }
    assert colours.COMPONENT_COLORS["compute_kernels"] != colours.COMPONENT_COLORS["compute"]
    assert overview.GPU_COMPUTE_NOTE in [c.value for c in at.caption]
    table = next(d.value for d in at.dataframe if f"{overview.GPU_BUSY} %" in d.value)
    assert f"{overview.COMPUTE_KERNELS} %" in table.columns
    at.sidebar.radio(key="view").set_value("Step breakdown").run()
    legend = {t["name"] for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert overview.GPU_COMPUTE in legend and overview.COMPUTE_KERNELS not in legend


@pytest.mark.parametrize("name", ["ddp2_dataloader_bound", "ddp2_healthy"])
def test_one_steady_step_per_run_in_every_finding(name: str) -> None:
    """Probe 31h, D2: the data-loader finding used the mean of the ranks' own steps
    (40.13 ms) while the first screen showed the run's steady step (40.06 ms), so "76.8 %
    of the step" did not follow from the 30.81 ms and 40.06 ms printed beside it; on
    ddp2_healthy two findings said "step" for 41.16 and 40.76 ms. Every finding of every
    rank's waiting now uses the run's one steady step."""
    result = analyze(REPO / "sample_runs" / name)
    steady = result.run.steady_step_ms
    assert steady is not None
    for f in result.findings:
        if "step_ms" in f.evidence:
            assert f.evidence["step_ms"] == pytest.approx(steady, abs=0.001), f.kind
    stall = next((f for f in result.findings if f.kind == "dataloader_stall"), None)
    if stall is not None:
        share = stall.cost_ms_per_step / steady
        assert stall.evidence["share_of_step"] == pytest.approx(share, abs=0.0005)
        head = overview.verdict(result).headline
        assert f"{100 * share:.1f} %" in stall.title and f"{steady:.2f} ms" in head


def test_an_upper_bound_verdict_does_not_say_the_wait_was_set_apart(shared_traces: Path) -> None:
    """Probe 31h, D9: on one rank of 8 (tracelens MI300), no collective matched across
    ranks, so the wait for late peers could not be told from the transfer: the verdict
    said it was "set apart" while the note under it and the finding said it was unknown."""
    result = analyze(shared_traces / "tracelens_mi300_ddp")
    verdict = overview.verdict(result)
    assert verdict.finding is not None and verdict.finding.evidence["cost_is_upper_bound"]
    assert "set apart" not in verdict.headline
    assert "an upper bound" in verdict.headline and "at most" in verdict.headline
    plain = overview.verdict(analyze(REPO / "sample_runs" / "ddp2_healthy")).headline
    assert "(the wait for late peers set apart)" in plain


def test_a_verdict_over_every_step_is_tied_to_the_charts_profiled_steps() -> None:
    """Probe 31h, D1: a 2-rank job's straggler verdict (every matched step) and the chart
    (the profiled steps, slower under the profiler) differed, and the note put the gap
    down to "other late ranks" that did not exist; the data-loader verdict had no note.
    Recorded here: rank 1 sleeping 50 ms per step beside three CPU hogs."""
    result = analyze(REPO / "tests" / "fixtures" / "busy_host" / "rank1_sleeps_50ms")
    verdict = overview.verdict(result)
    assert verdict.finding is not None and verdict.finding.kind == "straggler"
    assert verdict.finding.evidence["others_max_wait_caused_ms"] == 0.0
    note = verdict.chart_note
    assert "other late ranks" not in note
    # the verdict's own line ties its number to the chart's column, each with its window
    # (probe 31j, D2: a gap under 5 % had no word at all)
    assert (
        "wait for it 53.49 ms/step, median over 29 matched steps (in the chart, 'waiting for "
        "rank 1 (late peer)' on the other ranks is rank 0's bar, 57.09 ms per step, each bar "
        "the mean over its 5 profiled steps)" in verdict.headline
    )
    data = overview.verdict(analyze(REPO / "sample_runs" / "ddp2_dataloader_bound"))
    assert data.finding is not None and data.finding.kind == "dataloader_stall"
    assert data.chart_note == (
        "The chart's 'data loading' is the mean of ranks 0 and 1's bars, 30.52 ms (rank 0 "
        "30.51 ms, rank 1 30.52 ms) per step, each bar the mean over the 3 profiled steps. "
        "The verdict's 30.81 ms/step (the mean over ranks 0 and 1) is over every recorded "
        "step of the run."
    )


def test_a_data_wait_caption_quotes_the_named_ranks_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 31k, N1: under the Overview chart (and in the HTML report) "The chart's 'data
    loading' is 22.44 ms per step", the mean over ranks of bars of 0.58 and 44.29 ms, beside
    a verdict of rank 1's 44.68 ms: read as the profiled window showing half the stall. The
    caption now gives the bar of the rank the finding names, and says so; the number is the
    SVG segment's in the dashboard and the plotly bar's in the HTML report. Recorded here:
    rank 1's data loader sleeps 40 ms per step (3 CPU hogs beside it)."""
    run = REPO / "tests" / "fixtures" / "busy_host" / "lightning_rank1_data_40ms_3_hogs"
    result = analyze(run)
    verdict = overview.verdict(result)
    top = verdict.finding
    assert top is not None and top.kind == "dataloader_stall" and top.ranks == [1]
    at = _app(monkeypatch, run)
    bars = _segments(_svg(at))
    rank1, rank0 = bars[(1, "data_loading")], bars[(0, "data_loading")]
    assert rank1 > 10 * rank0
    said = f"The chart's 'data loading' is rank 1's bar, {rank1:.2f} ms per step"
    captions = [_plain(c.value) for c in at.caption]
    assert any(said in c for c in captions), captions
    wrong = f"{(rank0 + rank1) / 2:.2f} ms"  # the mean over ranks: no bar of the chart
    assert not any(wrong in c for c in captions), captions
    html = _plain(render_html([result])).replace("&#x27;", "'")
    assert said in html and wrong not in html
    fig = overview.rank_parts(result)
    import plotly.graph_objects as go

    from gpudiag.report import figures

    trace = next(
        t for t in figures.rank_parts_figure(fig).data if t.name == fig.labels["data_loading"]
    )
    assert isinstance(trace, go.Bar)
    drawn = dict(zip([str(x).replace("◀", "").strip() for x in trace.x], trace.y, strict=True))
    assert f"{drawn['rank 1']:.2f}" == f"{rank1:.2f}", drawn  # the HTML report's bar
