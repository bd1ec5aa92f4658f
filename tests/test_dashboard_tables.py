"""Every table of every view reads by one rule (browser probe of issue 31, F, G, L, C):
numbers through the shared formatter (two decimals for ms, MiB, GB/s, one for a
percentage, integers without), one mark for a missing value (``numbers.NA``), a header
in words with its unit (no snake_case key), the exposed communication under the
Overview's names in the Step breakdown, and Compare's Run B in the page URL. Driven
with the real Streamlit AppTest on the shipped sample runs and a public GPU trace set;
the numbers shown are read from what the browser receives (the table's display values).
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.analysis.gpu import NvmlGpu  # noqa: E402
from gpudiag.report import colours, numbers, overview, tables  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.terminal import print_report  # noqa: E402
from tests.dashboard_shown import table_with  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SAMPLES = REPO / "sample_runs"
VIEWS = ("Overview", "Step breakdown", "Communication", "GPU metrics", "DataParallel", "Code")
# what a missing value must never read as (numbers.NA is the one mark)
NOT_MISSING_MARKS = {"", "nan", "NaN", "None", "none", "-", "<NA>", "NaT", "null", "inf"}
NUMBER = re.compile(r"^-?\d+(?:\.(\d+))?( [%a-zA-Z/]+)?$")
SNAKE = re.compile(r"[a-z0-9]_[a-z]")


def _app(monkeypatch: pytest.MonkeyPatch, root: Path, **params: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown(element: Any) -> pd.DataFrame:
    """A ``st.dataframe`` as the browser draws it: the Styler's display values (what
    numbers.styled formats); a frame sent without them is shown by the browser's own
    number format, which the rule forbids, so it must be text already."""
    arrow = element.proto.arrow_data
    if arrow.styler.display_values:
        return dataframe_util.convert_arrow_bytes_to_pandas_df(arrow.styler.display_values)
    frame = element.value
    raw = [c for c in frame.columns if not all(isinstance(v, str) for v in frame[c])]
    assert not raw, f"columns shown without the shared formatter: {raw}"
    return frame


def _check_table(frame: pd.DataFrame, where: str) -> None:
    for header in frame.columns:
        assert not SNAKE.search(str(header)), f"{where}: raw key {header!r} shown as a header"
        digits = numbers.digits_for(header)
        for cell in frame[header].tolist():
            text = str(cell).replace("\\", "")  # st.table cells are escaped Markdown
            assert text.strip() not in NOT_MISSING_MARKS, f"{where}: {header!r} shows {cell!r}"
            found = NUMBER.match(text)
            if header in _COUNTS or digits == numbers.COUNT_DIGITS:
                # a count: whole without decimals, a mean that is not whole with two
                assert found, f"{where}: {header!r} shows {text!r}"
                if found.group(1) is not None:
                    assert len(found.group(1)) == numbers.MS_DIGITS, (where, header, text)
                    assert float(text) != round(float(text)), f"{where}: {header!r}: {text!r}"
            elif found and found.group(1) is not None:
                assert len(found.group(1)) == digits, f"{where}: {header!r} shows {text!r}"


# Count columns whose header does not end in "per step" (numbers.digits_for), each named
# once in gpudiag/report: the collectives' mean calls per rank
_COUNTS = {"calls/rank"}


def _check_view(at: AppTest, view: str, run: str) -> int:
    at.sidebar.radio(key="view").set_value(view).run()
    assert not at.exception, (run, view, [e.value for e in at.exception])
    assert not [e.value for e in at.error if "could not render" in e.value], (run, view)
    for i, element in enumerate(at.dataframe):
        _check_table(shown(element), f"{run} {view} dataframe {i}")
    for i, table in enumerate(at.table):
        _check_table(table.value, f"{run} {view} table {i}")
    return len(at.dataframe) + len(at.table)


@pytest.mark.parametrize(
    "run", ["ddp4_straggler", "ddp2_dataloader_bound", "bench_cpu/single-bs32"]
)
def test_every_table_of_every_view_follows_the_number_rule(
    monkeypatch: pytest.MonkeyPatch, run: str
) -> None:
    """Before, the data-loading and bucket tables printed 3 decimals and "None", the
    DataParallel stages 3, every collective call raw floats and "nan", the lint cost
    None; their headers were the analysis's keys (``data_ms_per_step``)."""
    at = _app(monkeypatch, SAMPLES / run)
    counted = sum(_check_view(at, view, run) for view in VIEWS)
    assert counted >= 5


def test_gpu_trace_tables_follow_the_number_rule(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """A GPU run: the kernel-busy percentages with one decimal, the host
    synchronisation table in words."""
    at = _app(monkeypatch, shared_traces / "param_dlrm_ddp8")
    for view in VIEWS:
        _check_view(at, view, "param_dlrm_ddp8")
    at.sidebar.radio(key="view").set_value("GPU metrics").run()
    header = f"{overview.GPU_BUSY} %"
    busy = next(shown(d) for d in at.dataframe if header in d.value)
    assert all(re.fullmatch(r"\d+\.\d", v) for v in busy[header])


def test_data_loading_and_bucket_headers_are_words_with_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = SAMPLES / "ddp2_dataloader_bound"
    result = analyze(run)
    at = _app(monkeypatch, run)
    at.sidebar.radio(key="view").set_value("Step breakdown").run()
    every = next(d for d in at.dataframe if "data wait ms/step" in d.value.columns)
    want = [result.dataloader.run[r].data_ms_per_step for r in sorted(result.dataloader.run)]
    assert every.value["data wait ms/step"].tolist() == pytest.approx(want)
    assert shown(every)["data wait ms/step"].tolist() == [numbers.num(v) for v in want]
    assert "step ms (mean over every recorded step)" in every.value.columns
    at.sidebar.radio(key="view").set_value("Communication").run()
    buckets = next(d for d in at.dataframe if "bucket (issue order)" in d.value.columns)
    assert {"size MiB", "start ms (in step)", "duration ms"} <= set(buckets.value.columns)
    sizes = result.buckets.frame()["bytes"] / 2**20
    assert shown(buckets)["size MiB"].tolist()[:4] == [numbers.num(v) for v in sizes[:4]]


def test_nvml_summary_reads_as_words_and_percentages() -> None:
    """The NVML table (a run with samples, none shipped here) was the raw to_json keys."""
    gpus = [
        NvmlGpu(node=0, gpu=0, samples=10, util_gpu_mean=87.25, power_w_mean=301.5,
                mem_used_max_gb=70.123, mem_total_gb=80.0, mem_headroom_fraction=0.1234,
                throttled_share=0.5, throttle_share_by_reason={"power_cap": 0.5}),
        NvmlGpu(node=0, gpu=1, samples=10),
    ]  # fmt: skip
    frame = tables.nvml_frame(gpus)
    text = numbers.frame_text(frame)
    _check_table(text, "nvml")
    row = text.iloc[0]
    assert row["GPU utilisation % (mean)"] == "87.2"  # one decimal: a percentage
    assert row["memory headroom %"] == "12.3" and row["time throttled %"] == "50.0"
    assert row["throttled by reason (% of the time)"] == "power_cap 50 %"
    assert row["power W (mean)"] == "301.50"
    assert text.iloc[1]["GPU utilisation % (mean)"] == numbers.NA


def test_reports_tables_use_the_one_missing_mark() -> None:
    """The terminal and HTML reports' tables: the same decimals, the same dash."""
    result = analyze(SAMPLES / "ddp2_dataloader_bound")
    html = render_html([result])
    for mark in ("nan", "None", "-", ""):
        assert f"<td>{mark}</td>" not in html
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=300, color_system=None))
    cells = [
        c.strip() for line in buf.getvalue().splitlines() if "│" in line for c in line.split("│")
    ]
    assert not {"nan", "None", "NaN"} & set(cells)
    # the blank and NumPy cells the dashboard's tables hold read as every report's
    assert numbers.cell_text("  ", 2) == numbers.NA
    assert numbers.num(pd.Series([3]).iloc[0]) == "3"
    assert numbers.num(pd.Series([True]).iloc[0]) == "yes"
    assert numbers.digits_for("overlap % of comm, waits included") == numbers.PCT_DIGITS
    assert numbers.digits_for("B − A %") == numbers.PCT_DIGITS
    assert numbers.digits_for("size MiB") == numbers.MS_DIGITS
    assert numbers.digits_for("since last step s") == numbers.S_DIGITS
    assert numbers.digits_for("steps/s") == numbers.MS_DIGITS


def test_watch_table_uses_the_one_formatter() -> None:
    """`gpudiag watch` printed one decimal for ms, "-" for a missing value and "50 %" for
    a percentage, where the dashboard's live table of the same snapshot printed two, the
    dash and one decimal."""
    from gpudiag.analysis.live_snapshot import LiveMonitor
    from gpudiag.report.watch_text import render_live

    snap = LiveMonitor([SAMPLES / "ddp4_straggler"]).refresh().snapshot
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render_live(snap, "run"))
    text = buf.getvalue()
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert rows and all("-" not in row for row in rows), text
    for row, rank in zip(rows, snap.ranks, strict=False):
        assert numbers.num(rank.last_step_ms) in row, (row, rank)
    assert re.search(r"host CPU \d+\.\d %", text), text


def test_step_breakdown_names_exposed_communication_as_the_overview(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Step breakdown said "exposed communication" where the Overview split it into
    "waiting for late peers" and "transfer" and its table said "comm exposed": one label
    per meaning, the per-step sum under the Overview's name and its split per rank under
    the chart's names, with the chart's numbers."""
    run = SAMPLES / "ddp4_straggler"
    result = analyze(run)
    parts = overview.rank_parts(result)
    labels = parts.labels
    headers = overview.rank_headers(result)
    assert headers["comm_exposed"] == f"{labels['comm_exposed']} ms/step"
    assert headers["comm_wait"] == f"of it {labels['comm_wait']} ms/step"
    at = _app(monkeypatch, run)
    table_with(at, headers["comm_exposed"])  # the Overview's table
    at.sidebar.radio(key="view").set_value("Step breakdown").run()
    table_with(at, f"{labels['comm_exposed']} ms")
    split = next(d.value for d in at.dataframe if f"{labels['comm_wait']} ms/step" in d.value)
    wait, transfer = f"{labels['comm_wait']} ms/step", f"{labels['comm_transfer']} ms/step"
    assert split[wait].tolist() == pytest.approx(parts.frame["comm_wait"].tolist())
    assert split[transfer].tolist() == pytest.approx(parts.frame["comm_transfer"].tolist())
    assert split[headers["comm_exposed"]].tolist() == pytest.approx(
        result.ranks["comm_exposed"].tolist()
    )
    caption = " ".join(c.value for c in at.caption).replace("\\", "")
    assert f"{labels['comm_wait']} + {labels['comm_transfer']}" in caption
    # the chart splits each step's exposed communication as the Overview does, in the
    # Overview's colours: a rank's steps average to its Overview column, each step adds
    # up to its exposed time (probe 31f, D2: one 40-50 ms block read communication-bound)
    traces = {t["name"]: t for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert labels["comm_exposed"] not in traces
    bd = result.breakdown.sort_values(["rank", "step"]).reset_index(drop=True)
    for key in ("comm_wait", "comm_transfer"):
        trace = traces[labels[key]]
        assert trace["marker"]["color"] == colours.COMPONENT_COLORS[key]
        per_step = pd.Series(_ys(trace), index=bd.index)
        means = per_step.groupby(bd["rank"]).mean()
        assert means.tolist() == pytest.approx(parts.frame[key].tolist(), abs=1e-6), key
    summed = pd.Series(_ys(traces[labels["comm_wait"]])) + pd.Series(
        _ys(traces[labels["comm_transfer"]])
    )
    assert summed.tolist() == pytest.approx(bd["comm_exposed"].tolist(), abs=1e-6)
    waiting = parts.frame.set_index("rank")["comm_wait"]
    assert waiting[2] == 0 and min(waiting[[0, 1, 3]]) > 35  # the straggler's peers wait


def _ys(trace: dict) -> list[float]:
    """A plotly trace's y values (a list, or the typed array plotly sends)."""
    y = trace["y"]
    if isinstance(y, dict):  # {"dtype": "f8", "bdata": base64}
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return [float(v) for v in y]


def test_compare_splits_exposed_communication_as_the_overview(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compare's metric table and chart had one "exposed communication" row, so the
    straggler's waiting (29.44 ms/step of its 37.98) read as a communication regression
    (probe 31f, D2). Both runs split: waiting for late peers and transfer, each the mean
    over ranks of the run's Overview columns, in the Overview's colours."""
    a, b = SAMPLES / "ddp4_straggler", SAMPLES / "ddp2_healthy"
    parts = [overview.rank_parts(analyze(r)) for r in (a, b)]
    # two runs side by side: the wait by its general name (run A's names rank 2)
    labels = {**parts[0].labels, "comm_wait": overview.WAITING}
    at = _app(
        monkeypatch,
        SAMPLES,
        run="sample_runs/ddp4_straggler",
        view="Compare",
        partner="sample_runs/ddp2_healthy",
    )
    table = next(d.value for d in at.dataframe if "metric" in d.value.columns)
    metrics = table["metric"].tolist()
    assert f"{labels['comm_exposed']} ms/step" not in metrics
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    for key in ("comm_wait", "comm_transfer"):
        row = table[table["metric"] == f"{labels[key]} ms/step"]
        assert len(row) == 1, (key, metrics)
        for col, p in zip(table.columns[1:3], parts, strict=True):
            assert float(row[col].iloc[0]) == pytest.approx(p.frame[key].mean(), abs=1e-6)
        i = chart[1]["x"].index(f"{labels[key]} ms/step")
        assert chart[1]["marker"]["color"][i] == colours.COMPONENT_COLORS[key]
    wait = table[table["metric"] == f"{labels['comm_wait']} ms/step"]
    assert float(wait.iloc[0, 1]) > 25 > float(wait.iloc[0, 2])  # A waits, B hardly


def test_compare_partner_is_in_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run B was not in the URL: a reload or a shared link lost it (browser probe of
    issue 31, C). ?partner= opens that comparison; choosing Run B from another view
    puts it in the URL; Run A is the run shown (?run=)."""
    a, b = "sample_runs/ddp2_healthy", "sample_runs/ddp2_dataloader_bound"
    at = _app(monkeypatch, SAMPLES, run=a, view="Compare", partner=b)
    assert at.selectbox(key="partner").value == b
    assert at.selectbox(key=f"compare_a:{a}").value == a
    table = at.dataframe[0].value
    assert f"A: {a} (ms/step)" in table.columns and f"B: {b} (ms/step)" in table.columns
    assert at.query_params["partner"] == b
    # another view drops the parameter; back in Compare, the partner is restored
    at.sidebar.radio(key="view").set_value("Overview").run()
    assert "partner" not in at.query_params
    at.sidebar.radio(key="view").set_value("Compare").run()
    assert at.selectbox(key="partner").value == b and at.query_params["partner"] == b
    # Run A changed in Compare is the run shown: the sidebar and ?run= follow; B stays
    # only when comparable with the new A: the 4-rank run has no partner among the
    # samples (it kept the 2-rank B before: issue 31, F; tests/test_dashboard_compare.py)
    c = "sample_runs/ddp4_straggler"
    at.selectbox(key=f"compare_a:{a}").set_value(c).run()
    assert at.sidebar.selectbox[0].value == c and at.query_params["run"] == c
    assert at.selectbox(key="partner").value is None and "partner" not in at.query_params
    # a partner that names no run is dropped, never an error
    bad = _app(monkeypatch, SAMPLES, run=a, view="Compare", partner="no/such/run")
    assert bad.selectbox(key="partner").value != "no/such/run"


@pytest.mark.browser
def test_browser_url_with_partner_opens_the_comparison() -> None:
    """In Chromium: the shared URL opens the comparison; leaving Compare and coming back
    writes the partner into the page's URL again (the browser, not AppTest, writes it)."""
    import time
    import urllib.parse

    from tests.browser import dashboard as browser

    a, b = "sample_runs/ddp2_healthy", "sample_runs/ddp2_dataloader_bound"
    server = browser.Dashboard([SAMPLES])
    try:
        server.wait_ready()
        with browser.browser() as page:
            query = urllib.parse.urlencode({"run": a, "view": "Compare", "partner": b})
            page.goto(f"{server.url}/?{query}")
            page.wait_for_selector('h2:has-text("Compare")', timeout=180_000)
            browser.wait_idle(page, 180_000)
            selects = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input')
            assert [s.input_value() for s in selects.all()] == [a, b]
            sidebar = page.locator('[data-testid="stSidebar"] label')
            for view in ("Overview", "Compare"):
                sidebar.filter(has_text=view).click()
                time.sleep(2)
                browser.wait_idle(page, 120_000)
            assert f"partner={urllib.parse.quote_plus(b)}" in page.url, page.url
            assert [s.input_value() for s in selects.all()] == [a, b]
            assert page.locator(browser.EXCEPTION).count() == 0
    finally:
        server.close()


def test_counts_per_step_read_as_counts_everywhere(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """A count per step or rank read "6.0" (calls/rank), "124.00" (syncs per step) and
    "2.00" (buckets per step, terminal) (probe 31f, D7): whole counts are written without
    decimals in the dashboard, the terminal and the HTML; a mean that is not whole keeps
    the formatter's two."""
    assert numbers.count(6.0) == "6" and numbers.count(93) == "93"
    assert numbers.count(2.5) == "2.50" and numbers.count(None) == numbers.NA
    assert numbers.num(6.0, numbers.COUNT_DIGITS) == "6"
    assert numbers.digits_for("syncs per step") == numbers.COUNT_DIGITS
    assert numbers.digits_for("data wait ms/step") == numbers.MS_DIGITS
    straggler = analyze(SAMPLES / "ddp4_straggler")
    buf = io.StringIO()
    print_report(straggler, console=Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    assert re.search(r"buckets per step: 2\b(?!\.)", text), text
    calls = overview.collectives_frame(straggler.collective_summary, straggler.collective_wall)
    want = [numbers.count(c) for c in calls["calls/rank"]]
    assert want and all("." not in w for w in want), want  # 6 calls per rank, whole
    html = render_html([straggler])
    assert all(f"<td>{w}</td>" in html for w in want), want
    at = _app(monkeypatch, SAMPLES / "ddp4_straggler")
    at.sidebar.radio(key="view").set_value("Communication").run()
    header = "calls/rank in the 3 profiled steps"  # the window it counts over (probe 31m)
    table = next(shown(d) for d in at.dataframe if header in d.value.columns)
    assert table[header].tolist() == want
    dlrm = shared_traces / "param_dlrm_ddp8"
    at = _app(monkeypatch, dlrm)
    at.sidebar.radio(key="view").set_value("Step breakdown").run()
    syncs = next(shown(d) for d in at.dataframe if "syncs per step" in d.value.columns)
    # each sync point once (aten::item around a cudaStreamSynchronize was 2-3)
    assert syncs["syncs per step"].tolist()[:3] == ["110", "54", "98"]


def test_the_two_data_loading_numbers_say_what_each_measures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 of the straggler: the chart's data loading 0.23 ms/step, the DataLoader
    table's data wait 0.32 for the same 3 profiled steps, unexplained (probe 31f, D13).
    The table's data wait is all of the DataLoader time; the chart's the part with no
    compute or communication running, so never more: the caption under the table says so."""
    run = SAMPLES / "ddp4_straggler"
    result = analyze(run)
    chart = result.ranks.set_index("rank")["data_loading"]
    waits = {t.rank: t.data_ms_per_step for t in result.dataloader.trace}
    assert all(chart[r] <= waits[r] + 1e-9 for r in waits)
    assert waits[0] - chart[0] > 0.05  # rank 0: 0.32 against 0.23
    at = _app(monkeypatch, run)
    at.sidebar.radio(key="view").set_value("Step breakdown").run()
    titles = [m.value for m in at.markdown]
    assert f"**{tables.DATA_WAIT_PROFILED}**" in titles
    captions = [c.value for c in at.caption]
    assert tables.DATA_WAIT_PROFILED_NOTE in captions
    note = tables.DATA_WAIT_PROFILED_NOTE
    assert "no compute and no communication" in note and "can be lower" in note
