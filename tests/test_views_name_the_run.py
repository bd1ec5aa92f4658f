"""Probe 31m: only the Overview named the run it showed; the other views said
"Timeline", "Communication", ... and nothing else, so a reader who came by a shared URL
or the sidebar could not tell which run's numbers these were. Every view's header now
names it (Compare: Run A). The dashboard through AppTest on a shipped sample run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from dashboards import views  # noqa: E402
from dashboards.widgets import md  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SAMPLES = REPO / "sample_runs"


def test_every_view_names_the_run_it_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", str(SAMPLES)])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(run="sample_runs/ddp4_straggler")
    at.run()
    label = at.sidebar.selectbox(key="run").value
    assert label.endswith("ddp4_straggler")
    for name in views.VIEWS:
        at.sidebar.radio(key="view").set_value(name).run()
        assert not at.exception, [e.value for e in at.exception]
        whose = "Run A: " if name == "Compare" else ""
        assert at.header[0].value == f"{name} · {whose}{md(label)}", name
