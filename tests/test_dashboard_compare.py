"""Compare's Run B (probe of issue 31, F): the default partner is a run comparable step
for step with Run A (same world size, backend and script with its arguments, where the
results say so) or none with a one-line note; a partner of another shape gets a warning;
Run B is in the page URL (?partner=). Driven with Streamlit's AppTest on copies of the
shipped sample runs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from dashboards import cache, views  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SAMPLES = REPO / "sample_runs"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bench (single process vs 2-rank DDP, the pair Compare used to default to), a
    4-rank run, and the healthy 2-rank run twice (the only comparable pair)."""
    root = tmp_path_factory.mktemp("runs")
    for name in ("bench_cpu", "ddp4_straggler", "ddp2_healthy"):
        shutil.copytree(SAMPLES / name, root / name)
    shutil.copytree(SAMPLES / "ddp2_healthy", root / "healthy_again")
    return root


def _app(monkeypatch: pytest.MonkeyPatch, root: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    labels = at.sidebar.selectbox(key="run").options
    for label in labels:  # every run analysed (the server's prewarm does the same)
        at.sidebar.selectbox(key="run").set_value(label).run()
    at.sidebar.radio(key="view").set_value("Compare").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _show(at: AppTest, run: str) -> AppTest:
    at.sidebar.selectbox(key="run").set_value(run).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _warnings(at: AppTest) -> list[str]:
    return [w.value.replace("\\", "") for w in at.warning]


def _label(at: AppTest, name: str) -> str:
    return next(o for o in at.sidebar.selectbox(key="run").options if o.endswith(name))


def test_default_partner_is_comparable_or_none_and_in_the_url(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    at = _app(monkeypatch, root)
    healthy, again = _label(at, "ddp2_healthy"), _label(at, "healthy_again")
    four = _label(at, "ddp4_straggler")
    # the bench's 2-rank DDP run was paired with its 1-process run (another world size,
    # backend and script): now none, said in one line; no partner in the URL
    for name in ("bench_cpu/ddp-bs128", "bench_cpu/single-bs128", "ddp4_straggler"):
        _show(at, _label(at, name))
        assert at.selectbox(key="partner").value is None, name
        assert "partner" not in at.query_params, name
        assert views.NO_PARTNER in [c.value for c in at.caption], name
        assert not _warnings(at), name
    # a comparable run exists: it is the default, in the URL, and nothing is warned of
    _show(at, healthy)
    assert at.selectbox(key="partner").value == again
    assert at.query_params["partner"] == again
    assert not _warnings(at)
    assert views.NO_PARTNER not in [c.value for c in at.caption]
    # a partner of another shape picked by hand: in the URL, and the page warns
    # (the browser writes a select's value into the URL when it is clicked: AppTest has
    # no browser; test_dashboard_tables.py::test_browser_url_with_partner_opens_the_comparison)
    at.selectbox(key="partner").set_value(four).run()
    assert at.session_state["partner"] == four
    warned = _warnings(at)
    assert any(w.startswith("World size differs: A 2 ranks, B 4.") for w in warned), warned
    assert any(w.startswith("Script or arguments differ") for w in warned), warned


def test_a_new_run_a_keeps_its_partner_only_when_comparable(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """Compare's own Run A select: the partner stayed with the new run A whatever its
    shape (a 4-rank run A kept the 2-rank partner of the run before it)."""
    at = _app(monkeypatch, root)
    healthy, again = _label(at, "ddp2_healthy"), _label(at, "healthy_again")
    four = _label(at, "ddp4_straggler")
    _show(at, healthy)
    assert at.selectbox(key="partner").value == again
    at.selectbox(key=f"compare_a:{healthy}").set_value(four).run()
    assert at.query_params["run"] == four
    assert at.selectbox(key="partner").value is None
    assert "partner" not in at.query_params
    assert not _warnings(at)
    # and back: the 2-rank run A finds its comparable partner again
    at.selectbox(key=f"compare_a:{four}").set_value(again).run()
    assert at.selectbox(key="partner").value == healthy
    assert at.query_params["partner"] == healthy


def test_a_shared_url_opens_the_same_comparison(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """?run=&view=Compare&partner= opens that pair, even one of another shape (the reader
    asked for it), with the warning."""
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    first = AppTest.from_file(str(APP), default_timeout=300)
    first.run()
    four = next(
        o for o in first.sidebar.selectbox(key="run").options if o.endswith("ddp4_straggler")
    )
    healthy = next(
        o for o in first.sidebar.selectbox(key="run").options if o.endswith("ddp2_healthy")
    )
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update({"run": healthy, "view": "Compare", "partner": four})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="partner").value == four
    assert at.query_params["partner"] == four
    assert any(w.startswith("World size differs") for w in _warnings(at))


@pytest.mark.browser
def test_browser_run_b_picked_by_hand_is_in_the_url(root: Path) -> None:
    """In Chromium (the browser writes a bound select's value into the URL; AppTest
    cannot): Run B picked by hand, of another shape, is in the page URL and warned of."""
    import time
    import urllib.parse

    from tests.browser import dashboard as browser

    server = browser.Dashboard([root])
    try:
        server.wait_ready()
        with browser.browser() as page:
            a = f"{root.name}/ddp2_healthy"
            b = f"{root.name}/ddp4_straggler"
            query = urllib.parse.urlencode({"run": a, "view": "Compare"})
            page.goto(f"{server.url}/?{query}")
            page.wait_for_selector('h2:has-text("Compare")', timeout=180_000)
            browser.wait_idle(page, 180_000)
            run_b = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').nth(1)
            run_b.click()
            run_b.fill(b)
            page.keyboard.press("Enter")
            page.get_by_text("World size differs").first.wait_for(timeout=180_000)
            browser.wait_idle(page, 180_000)
            deadline = time.monotonic() + 10
            while f"partner={urllib.parse.quote_plus(b)}" not in page.url:
                assert time.monotonic() < deadline, page.url
                time.sleep(0.25)
            assert run_b.input_value() == b
            assert page.locator(browser.EXCEPTION).count() == 0
    finally:
        server.close()


def test_the_default_run_b_is_in_the_url_on_the_first_draw(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """Compare opened from a URL without ?partner= (or from another view) picks its default
    Run B and writes it into the URL like a hand-picked one: a shared link then names Run B
    (probe 31f, D10: the URL stayed ?run=...&view=Compare)."""
    at = _app(monkeypatch, root)  # every run analysed: the default partner can be found
    healthy, again = _label(at, "ddp2_healthy"), _label(at, "healthy_again")
    opened = AppTest.from_file(str(APP), default_timeout=300)
    opened.query_params.update({"run": healthy, "view": "Compare"})
    opened.run()
    assert not opened.exception, [e.value for e in opened.exception]
    assert opened.selectbox(key="partner").value == again
    assert opened.query_params["partner"] == again
    # reached from the Overview: the same
    clicked = AppTest.from_file(str(APP), default_timeout=300)
    clicked.query_params.update({"run": healthy})
    clicked.run()
    assert "partner" not in clicked.query_params
    clicked.sidebar.radio(key="view").set_value("Compare").run()
    assert clicked.selectbox(key="partner").value == again
    assert clicked.query_params["partner"] == again
    # away and back: Run B again, and in the URL
    clicked.sidebar.radio(key="view").set_value("Overview").run()
    clicked.sidebar.radio(key="view").set_value("Compare").run()
    assert clicked.selectbox(key="partner").value == again
    assert clicked.query_params["partner"] == again
    # a run with no comparable partner: none in the URL
    four = _label(at, "ddp4_straggler")
    alone = AppTest.from_file(str(APP), default_timeout=300)
    alone.query_params.update({"run": four, "view": "Compare"})
    alone.run()
    assert alone.selectbox(key="partner").value is None
    assert "partner" not in alone.query_params


@pytest.mark.browser
def test_browser_default_run_b_is_in_the_url(root: Path) -> None:
    """In Chromium: Compare opened from a URL that names no Run B picks the comparable run
    and the page URL names it (probe 31f, D10)."""
    import time
    import urllib.parse

    from tests.browser import dashboard as browser

    server = browser.Dashboard([root])
    try:
        server.wait_ready()
        with browser.browser() as page:
            a = f"{root.name}/ddp2_healthy"
            b = f"{root.name}/healthy_again"
            # both analysed first (the server's prewarm does it once the page is quiet)
            for run in (a, b):
                page.goto(f"{server.url}/?{urllib.parse.urlencode({'run': run})}")
                page.wait_for_selector('h2:has-text("Overview")', timeout=180_000)
                browser.wait_idle(page, 180_000)
            page.goto(f"{server.url}/?{urllib.parse.urlencode({'run': a, 'view': 'Compare'})}")
            page.wait_for_selector('h2:has-text("Compare")', timeout=180_000)
            browser.wait_idle(page, 180_000)
            deadline = time.monotonic() + 10
            while f"partner={urllib.parse.quote_plus(b)}" not in page.url:
                assert time.monotonic() < deadline, page.url
                time.sleep(0.25)
            run_b = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').nth(1)
            assert run_b.input_value() == b
            page.reload()
            page.wait_for_selector('h2:has-text("Compare")', timeout=180_000)
            browser.wait_idle(page, 180_000)
            assert f"partner={urllib.parse.quote_plus(b)}" in page.url
            assert page.locator(browser.EXCEPTION).count() == 0
    finally:
        server.close()


def test_per_rank_b_columns_stay_right_aligned_with_missing_ranks(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """A 4-rank run A against a 2-rank run B: B has no ranks 2 and 3, so its columns hold
    the missing mark and were sent as text, left-aligned beside the right-aligned A
    columns (probe 31f, D11). They read "–" and are right-aligned like numbers."""
    import json

    from gpudiag.report import numbers

    at = _app(monkeypatch, root)
    four, healthy = _label(at, "ddp4_straggler"), _label(at, "ddp2_healthy")
    opened = AppTest.from_file(str(APP), default_timeout=300)
    opened.query_params.update({"run": four, "view": "Compare", "partner": healthy})
    opened.run()
    assert not opened.exception, [e.value for e in opened.exception]
    pair = next(d for d in opened.dataframe if "B step ms (mean)" in d.value.columns)
    b_cols = [c for c in pair.value.columns if c.startswith("B ")]
    assert len(b_cols) >= 3, b_cols
    config = json.loads(pair.proto.columns)
    for col in b_cols:
        assert config.get(col, {}).get("alignment") == "right", (col, config)
        cells = pair.value[col].tolist()
        assert cells[2:] == [numbers.NA, numbers.NA], (col, cells)  # ranks 2 and 3
        assert all(float(c) >= 0 for c in cells[:2]), (col, cells)
    for col in [c for c in pair.value.columns if c.startswith("A ")]:
        assert pd.api.types.is_numeric_dtype(pair.value[col]), col  # numbers, sortable


def _compare_fresh(monkeypatch: pytest.MonkeyPatch, root: Path, run: str) -> AppTest:
    """Compare opened from a URL by a new session, on a server that has analysed only
    the runs this page asks for (an empty analysis cache)."""
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    monkeypatch.setattr(cache, "ANALYSES", cache.LruCache(cache.MAX_ANALYSES))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update({"run": run, "view": "Compare"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_default_run_b_does_not_depend_on_what_was_analysed(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """Probe N8: the default Run B was the first comparable run *among those analysed*,
    so it changed with the server's cache (none on a cold server, the twin once warm).
    Now it is read from the runs' manifests: the same on a cold and a warm server."""
    warm = _app(monkeypatch, root)  # every run analysed
    healthy, again = _label(warm, "ddp2_healthy"), _label(warm, "healthy_again")
    _show(warm, healthy)
    assert warm.selectbox(key="partner").value == again
    cold = _compare_fresh(monkeypatch, root, healthy)
    assert len(cache.ANALYSES) <= 2  # only Run A and the Run B shown were analysed
    assert cold.selectbox(key="partner").value == again
    assert cold.query_params["partner"] == again
    for name in ("ddp4_straggler", "bench_cpu/ddp-bs128"):  # none comparable, cold or warm
        cold = _compare_fresh(monkeypatch, root, _label(warm, name))
        assert cold.selectbox(key="partner").value is None, name
        assert views.NO_PARTNER in [c.value for c in cold.caption], name


def test_components_that_moved_are_largest_first_as_the_terminal_lists_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probe 31k, N4: Compare's "Components that moved" read "waiting +344.89, transfer
    +48.04, compute +129.82, ...": the exposed communication's split parts stood where
    exposed communication stands in `gpudiag compare`'s list, above larger changes. Now
    largest change first, and the same numbers as the terminal and the JSON (there
    exposed communication whole: the dashboard's waiting + transfer)."""
    import io
    import re

    from rich.console import Console

    from gpudiag.analysis import analyze
    from gpudiag.analysis.compare import compare
    from gpudiag.report.terminal import print_comparison

    a, b = SAMPLES / "ddp2_healthy", SAMPLES / "ddp4_straggler"
    monkeypatch.setattr(sys, "argv", ["app.py", str(SAMPLES)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(run="sample_runs/ddp2_healthy", view="Compare")
    at.query_params["partner"] = "sample_runs/ddp4_straggler"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    line = next(m.value for m in at.markdown if "Components that moved" in m.value)
    moved = re.findall(r"([^;:]+?) ([+-]\d+\.\d\d) ms", line.replace("\\", "").split("step): ")[1])
    deltas = [float(d) for _, d in moved]
    assert deltas == sorted(deltas, key=lambda d: -abs(d)), line
    shown = {name.strip(): float(d) for name, d in moved}
    comparison = compare(analyze(a), analyze(b))
    json_moved = {c["component"]: c["delta_ms"] for c in comparison.to_json()["changed_components"]}
    json_order = list(json_moved.values())
    assert json_order == sorted(json_order, key=lambda d: -abs(d))
    waited = [v for k, v in shown.items() if "waiting" in k or "transfer" in k]
    assert sum(waited) == pytest.approx(json_moved["comm_exposed"], abs=0.011)
    assert shown["compute"] == pytest.approx(json_moved["compute"], abs=0.005)
    out = io.StringIO()
    print_comparison(comparison, Console(file=out, width=300))
    terminal = out.getvalue()
    assert f"exposed communication {json_moved['comm_exposed']:+.2f} ms" in terminal
    assert f"compute {json_moved['compute']:+.2f} ms" in terminal
