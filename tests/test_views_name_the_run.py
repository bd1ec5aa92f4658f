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


def test_gpu_idle_is_in_view_in_the_gpu_metrics_table(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """GPU metrics' per-rank table put GPU idle sixth, past the right edge of a 1440 px
    window on the DLRM set (its columns ended at about 1,035 px of a 780 px frame): the key
    columns now come first, within the frame by the dashboard's own column sizing."""
    from dashboards import widgets

    monkeypatch.setattr(sys, "argv", ["app.py", str(shared_traces / "param_dlrm_ddp8")])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.sidebar.radio(key="view").set_value("GPU metrics").run()
    assert not at.exception, [e.value for e in at.exception]
    idle = views.BUSY_HEADERS["idle_ms_per_step"]
    (frame,) = [d.value for d in at.dataframe if idle in d.value.columns]
    widths = widgets.grid_widths(widgets.numbers.frame_text(frame))
    ends = dict(zip(frame.columns, [sum(widths[: i + 1]) for i in range(len(widths))], strict=True))
    for key in ("rank", idle, views.BUSY_HEADERS["busy_fraction"]):
        assert ends[key] <= widgets.FITS_PX, (key, ends)
