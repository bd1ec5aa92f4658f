"""Probe 31m, the unnamed windows: numbers over different windows (the steady step over
every recorded step, the profiled steps, the calls' steps) shown side by side must each
say their window, the same in the terminal, the HTML report and the dashboard; and a
profiled window much slower than the steady step is said. Recorded runs only (sample_runs,
tests/fixtures); `gpudiag compare` run as a subprocess beside the dashboard's Compare."""

from __future__ import annotations

import html as html_text
import io
import json
import os
import subprocess
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
SAMPLES = REPO / "sample_runs"
EXTRA_COMPUTE = REPO / "tests" / "fixtures" / "extra_compute_rank0" / "run"
SLOWED = "the profiler slows the steps it records, so the per-rank and op-level times"


def _terminal(result: object) -> str:
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=4000, color_system=None))
    return " ".join(buf.getvalue().split())


def _json(result: object) -> dict:
    buf = io.StringIO()
    jsonout.write_results([result], buf)
    return json.loads(buf.getvalue())


def _dashboard(monkeypatch: pytest.MonkeyPatch, run: Path, view: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(run)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    if view is not None:
        at.sidebar.radio(key="view").set_value(view).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _page(at: AppTest) -> str:
    texts = [*at.caption, *at.markdown, *at.warning, *at.info]
    return " ".join(t.value.replace("\\", "") for t in texts)


def test_a_profiled_window_slower_than_the_steady_step_is_said_in_every_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe's recording: the 5 profiled steps took 452.67 ms (median over ranks),
    the steady step 323.23 ms, and no view said the op-level numbers were inflated."""
    result = analyze(EXTRA_COMPUTE)
    payload = _json(result)
    medians = sorted(r["step_ms_median"] for r in payload["ranks"])
    profiled = (medians[0] + medians[-1]) / 2  # two ranks: their median
    steady = payload["run"]["steady_step_ms"]
    assert profiled / steady - 1 > 0.35
    words = (
        f"The 5 profiled steps took {profiled:.2f} ms (median over ranks), "
        f"{100 * (profiled / steady - 1):.0f} % more than the steady step {steady:.2f} ms"
    )
    at = _dashboard(monkeypatch, EXTRA_COMPUTE)
    views = {
        "terminal": _terminal(result),
        "html": html_text.unescape(render_html([result])),
        "dashboard": _page(at),
    }
    for name, text in views.items():
        assert words in text and SLOWED in text, name
    healthy = analyze(SAMPLES / "ddp2_healthy")  # 2 % slower: nothing said
    assert SLOWED not in _terminal(healthy) and SLOWED not in render_html([healthy])


def test_the_header_names_the_steady_and_the_profiled_windows() -> None:
    """ "steady step 56.41 ms | 3 steps analysed": which steps each is over."""
    result = analyze(SAMPLES / "ddp4_straggler")
    steady = _json(result)["run"]["steady_step_ms"]
    for name, text in {
        "terminal": _terminal(result),
        "html": html_text.unescape(render_html([result])),
    }.items():
        assert f"steady step {steady:.2f} ms (median over " in text, name
        assert "recorded steps after" in text and "3 profiled steps analysed" in text, name


@pytest.mark.parametrize(
    ("run", "window", "calls"),
    [
        (SAMPLES / "ddp4_straggler", "3 profiled steps", 6),
        (
            REPO / "tests/fixtures/busy_host/lightning_rank1_data_40ms_3_hogs",
            "40 recorded steps",
            81,
        ),
    ],
)
def test_calls_per_rank_names_the_steps_they_are_counted_over(
    monkeypatch: pytest.MonkeyPatch, run: Path, window: str, calls: int
) -> None:
    """ "calls/rank 6" beside per-step times was 2 calls a step over 3 profiled steps; a run
    whose calls come from its own tables counts every recorded step."""
    result = analyze(run)
    assert max(r["count"] for r in _json(result)["collectives"]) == calls
    header = f"calls/rank in the {window}"
    assert header in _terminal(result)
    assert header in render_html([result])
    at = _dashboard(monkeypatch, run, "Communication")
    frames = [d.value for d in at.dataframe if header in d.value.columns]
    assert frames and max(int(v) for v in frames[0][header]) == calls


def test_cli_compare_splits_the_wait_as_the_dashboard_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpudiag compare` showed exposed communication whole where the dashboard split it
    into waiting and transfer; and neither said that a finding's cost (the straggler's
    37.34 ms, the other ranks over every matched step) is over another window than the
    table's wait (28.84 ms, every rank over the profiled steps)."""
    a, b = SAMPLES / "ddp2_healthy", SAMPLES / "ddp4_straggler"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"}
    cli = subprocess.run(
        [sys.executable, "-m", "gpudiag", "compare", str(a), str(b)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    terminal = " ".join(cli.stdout.split())
    monkeypatch.setattr(sys, "argv", ["app.py", str(SAMPLES)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(run="sample_runs/ddp2_healthy", view="Compare")
    at.query_params["partner"] = "sample_runs/ddp4_straggler"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "metric" in d.value.columns)
    rows = {
        str(m).replace("\\", ""): row
        for m, (_, row) in zip(table["metric"], table.iterrows(), strict=True)
    }
    for metric in ("waiting for late peers ms/step", "transfer (exposed communication) ms/step"):
        row = rows[metric]
        a_ms, b_ms = (float(str(v).replace("\\", "")) for v in row.iloc[1:3])
        assert f"{metric} {a_ms:.2f} {b_ms:.2f}" in terminal.replace("│ ", "").replace(" │", ""), (
            metric
        )
    costs = "its own cost, over its own steps and ranks"
    assert costs in terminal and costs in _page(at)
    assert "straggler: none -> high (rank 2) 37.34 ms/step (appeared)" in terminal


def test_bucket_lanes_and_their_table_name_the_same_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The all-reduce lanes overlay every profiled step; their table lists a row per rank
    and step: neither said which steps, beside a collectives table counting over its own
    window."""
    run = SAMPLES / "ddp4_straggler"
    steps = sorted({int(s) for s in analyze(run).buckets.frame(["step"])["step"]})
    window = f"the {len(steps)} steps {steps[0]}-{steps[-1]}"
    at = _dashboard(monkeypatch, run, "Communication")
    assert f"Each lane: that call in each of {window}" in _page(at)
    (table,) = [e for e in at.expander if e.label.startswith("Table: ")]
    assert table.label == f"Table: a row per rank and call in each of {window}"
    (frame,) = [d.value for d in table.dataframe]
    assert sorted({int(s) for s in frame["step"]}) == steps
