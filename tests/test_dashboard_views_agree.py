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
