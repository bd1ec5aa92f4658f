"""Probe D3 (issue 31): the browser's Back button restored the URL but not the page. The
URL carries the run and the view shown; each page shown is one history entry; a page
drawn from a URL after Back or Forward shows that URL's run and view, not the session's
last choice. AppTest plays Back as the browser does (it reruns the app with the earlier
entry's query string); the real Back is driven in headless Chromium below."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ and tests/browser are not installed packages

APP = REPO / "dashboards" / "app.py"
SAMPLES = REPO / "sample_runs"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name in ("ddp2_healthy", "ddp4_straggler"):
        shutil.copytree(SAMPLES / name, root / name)
    shutil.copytree(SAMPLES / "ddp2_healthy", root / "healthy_again")
    return root


def _shown(at: AppTest) -> tuple[str, str]:
    assert not at.exception, [e.value for e in at.exception]
    return str(at.sidebar.selectbox(key="run").value), str(at.sidebar.radio(key="view").value)


def _url(at: AppTest) -> tuple[str, str]:
    return at.query_params["run"], at.query_params["view"]


def _back_to(at: AppTest, url: dict[str, str]) -> AppTest:
    """What the browser does on Back: the earlier entry's URL, the app rerun with it."""
    for key in list(at.query_params):
        if key not in url:
            del at.query_params[key]
    at.query_params.update(url)
    return at.run()


def test_back_restores_the_run_and_view_of_the_entry(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    first, *others = at.sidebar.selectbox(key="run").options
    four = next(o for o in others if o.endswith("ddp4_straggler"))
    history = [dict(at.query_params)]
    assert _url(at) == _shown(at) == (first, "Overview")  # the view is in the URL too
    at.sidebar.radio(key="view").set_value("Timeline").run()
    history.append(dict(at.query_params))
    assert _url(at) == _shown(at) == (first, "Timeline")
    at.sidebar.selectbox(key="run").set_value(four).run()
    history.append(dict(at.query_params))
    assert _url(at) == _shown(at) == (four, "Timeline")
    at.sidebar.radio(key="view").set_value("Communication").run()
    assert _url(at) == _shown(at) == (four, "Communication")
    # Back, Back, Back: each entry's run and view, not the session's last choice
    for entry in reversed(history):
        _back_to(at, entry)
        assert _shown(at) == _url(at) == (entry["run"], entry["view"])
        assert [h.value for h in at.header][0].startswith(entry["view"])
    # Forward, then a click: the page goes on from the entry shown
    _back_to(at, history[1])
    assert _shown(at) == (first, "Timeline")
    at.sidebar.radio(key="view").set_value("Code").run()
    assert _url(at) == _shown(at) == (first, "Code")


def test_compare_reached_from_the_sidebar_is_one_entry_with_its_run_b(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    """Run B's default was written after the view, a second history entry: Back from
    Compare went to Compare with an empty Run B. Now one write: Back leaves Compare."""
    monkeypatch.setattr(sys, "argv", ["app.py", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    healthy = next(o for o in at.sidebar.selectbox(key="run").options if o.endswith("ddp2_healthy"))
    again = next(o for o in at.sidebar.selectbox(key="run").options if o.endswith("healthy_again"))
    at.sidebar.selectbox(key="run").set_value(healthy).run()
    before = dict(at.query_params)
    at.sidebar.radio(key="view").set_value("Compare").run()
    assert at.query_params["partner"] == again and at.query_params["view"] == "Compare"
    _back_to(at, before)
    assert _shown(at) == (healthy, "Overview")


def _entry(page: Any) -> tuple[str, str]:
    from urllib.parse import parse_qs, urlparse

    query = parse_qs(urlparse(page.evaluate("location.href")).query)  # page.url may lag
    return query["run"][0], query["view"][0]


def _page_shows(page: Any, run: str, view: str) -> None:
    """The sidebar's run and view and the view's own header."""
    import re

    from tests.browser import dashboard as browser

    browser.wait_idle(page)
    header = re.compile(rf"^{re.escape(view)}( ·|$)")
    page.locator("h2").filter(has_text=header).first.wait_for(timeout=60_000)
    browser.wait_idle(page)
    # the header can be the last page's (the same view of another run) until the rerun
    # that the URL started has begun: wait for the sidebar's run too (CI, loaded host)
    page.wait_for_function(
        """run => {
            const box = document.querySelector('[data-testid="stSidebar"] [data-testid="stSelectbox"] input');
            return box !== null && box.value === run;
        }""",
        arg=run,
        timeout=60_000,
    )
    browser.wait_idle(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.locator('[data-testid="stSelectbox"] input').first.input_value() == run
    checked = sidebar.locator('[role="radiogroup"] input:checked')
    assert checked.first.evaluate("e => e.closest('label').innerText").strip() == view


@pytest.mark.browser
def test_browser_back_and_forward_restore_the_run_and_view(root: Path) -> None:
    """In Chromium: pick a view, another run, another view; Back three times shows each
    earlier run and view (the URL and the page), Forward the next."""
    from tests.browser import dashboard as browser

    dash = browser.Dashboard([root], port=18631)
    try:
        dash.wait_ready()
        with browser.browser() as page:
            page.set_viewport_size({"width": 1440, "height": 900})
            page.goto(dash.url)
            browser.wait_idle(page)
            first = _entry(page)
            assert first[1] == "Overview"
            _page_shows(page, *first)
            browser.open_view(page, "Timeline")
            select = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"] input')
            select.first.click()
            select.first.fill(f"{root.name}/ddp4_straggler")
            page.keyboard.press("Enter")
            page.wait_for_url("**run=*ddp4_straggler*", timeout=60_000)
            four = _entry(page)
            _page_shows(page, *four)
            assert four[1] == "Timeline"
            browser.open_view(page, "Communication")
            seen = [first, (first[0], "Timeline"), four, (four[0], "Communication")]
            assert _entry(page) == seen[-1]
            for want in reversed(seen[:-1]):
                page.go_back()
                page.wait_for_function(
                    "w => new URLSearchParams(location.search).get('view') === w[1]"
                    " && new URLSearchParams(location.search).get('run') === w[0]",
                    arg=list(want),
                    timeout=60_000,
                )
                _page_shows(page, *want)
            page.go_forward()
            page.wait_for_function(
                "() => new URLSearchParams(location.search).get('view') === 'Timeline'",
                timeout=60_000,
            )
            _page_shows(page, first[0], "Timeline")
    finally:
        dash.close()
