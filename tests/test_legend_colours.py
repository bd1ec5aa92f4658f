"""Probe 31m, a legend colour that is not its bars': a legend swatch shows one colour, the
first bar's, so a trace whose bars have several colours (Compare's per-component bars)
showed the step's near-black for bars of every component's colour. Every legend entry of
every chart of every dashboard view now stands for bars of its one colour. The dashboard
through AppTest on shipped sample runs (Compare: healthy vs straggler)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from dashboards import views  # noqa: E402

APP = REPO / "dashboards" / "app.py"


def _colours(trace: dict[str, Any]) -> set[str]:
    """The colours a trace draws its marks in (marker, else line)."""
    colour = (trace.get("marker") or {}).get("color")
    if colour is None:
        colour = (trace.get("line") or {}).get("color")
    if colour is None:
        return set()
    return {str(c) for c in colour} if isinstance(colour, list) else {str(colour)}


def _legend_traces(spec: dict[str, Any]) -> list[dict[str, Any]]:
    data = spec.get("data", [])
    shown = [t for t in data if t.get("showlegend", True) is not False]
    if spec.get("layout", {}).get("showlegend") is False or len(shown) < 2:
        return []  # plotly draws no legend for a single trace unless asked
    return shown


def test_every_legend_entry_has_its_bars_one_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", str(REPO / "sample_runs")])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(run="sample_runs/ddp2_healthy")
    at.query_params["partner"] = "sample_runs/ddp4_straggler"
    at.run()
    checked = 0
    for name in views.VIEWS:
        at.sidebar.radio(key="view").set_value(name).run()
        assert not at.exception, [e.value for e in at.exception]
        for chart in at.get("plotly_chart"):
            for trace in _legend_traces(json.loads(chart.proto.spec)):
                assert len(_colours(trace)) <= 1, (name, trace.get("name"), _colours(trace))
                checked += 1
    assert checked > 10
