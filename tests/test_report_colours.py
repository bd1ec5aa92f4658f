"""One colour per component across every chart (issue 31): each figure the HTML report
and the dashboard draw, built on real runs (the shipped sample_runs/ddp4_straggler, a
CPU gloo run, and a real GPU trace set from ../shared/traces), draws a component only
in its colour of ``colours.COMPONENT_COLORS``, under the Overview's name for it, and
nothing that is not a component borrows a component's colour."""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.analysis import live_snapshot as live
from gpudiag.analysis.compare import compare
from gpudiag.analysis.dataparallel import STAGES
from gpudiag.analysis.result import AnalysisResult
from gpudiag.report import colours, figures, html, overview
from gpudiag.report.colours import COMPONENT_COLORS, FALLBACK_COLOR, component_color

REPO = Path(__file__).resolve().parents[1]
STRAGGLER = REPO / "sample_runs" / "ddp4_straggler"
COMPONENT_HEXES = {c.lower() for c in COMPONENT_COLORS.values()}


@pytest.fixture(scope="module")
def cpu_run() -> AnalysisResult:
    return analyze(STRAGGLER)


@pytest.fixture(scope="module")
def gpu_run(shared_traces: Path) -> AnalysisResult:
    return analyze(shared_traces / "param_dlrm_ddp8", workers=1)


def _names() -> dict[str, str]:
    """Legend name -> component key, for every name any chart gives a component."""
    names = {k: k for k in COMPONENT_COLORS}
    for gpu in (True, False, None):
        for key, label in overview.component_labels(gpu).items():
            assert names.get(label, key) == key, f"{label!r} names two components"
            names[label] = key
    names[overview.GPU_BUSY] = "gpu_busy"
    names[figures.TIMELINE_COMMUNICATION] = "communication"
    names[overview.COMPUTE_KERNELS] = "compute_kernels"
    return names


def _trace_color(trace: Any) -> Any:
    marker = getattr(trace, "marker", None)
    if marker is not None and marker.color is not None:
        return marker.color
    line = getattr(trace, "line", None)
    return line.color if line is not None else None


def _check(fig: go.Figure, seen: dict[str, set[str]], chart: str) -> int:
    """Every trace named as a component has that component's colour; every other trace
    uses none of the components' colours. Returns the component traces checked."""
    names = _names()
    checked = 0
    for trace in fig.data:
        color = _trace_color(trace)
        key = names.get(trace.name)
        if key is None and str(trace.name).startswith("waiting for rank"):
            key = "comm_wait"  # the wait, named for the late rank the evidence names
        if key is None:
            shown = color if isinstance(color, (list, tuple)) else [color]
            assert not {str(c).lower() for c in shown} & COMPONENT_HEXES, (chart, trace.name)
            continue
        assert isinstance(color, str), (chart, trace.name, color)
        assert color == COMPONENT_COLORS[key], (chart, trace.name, color)
        seen.setdefault(key, set()).add(color)
        checked += 1
    return checked


def _figures(result: AnalysisResult) -> dict[str, go.Figure]:
    gpu = bool(result.run.has_gpu_trace)
    out = {
        "overview": figures.rank_parts_figure(overview.rank_parts(result)),
        "timeline": figures.timeline_figure(result.timeline(max_intervals=4000), gpu=gpu),
        "step breakdown": figures.step_breakdown_figure(
            result.breakdown, labels=overview.component_labels(gpu)
        ),
    }
    if result.gpu.kernel_busy:
        busy = pd.DataFrame([asdict(b) for b in result.gpu.kernel_busy])
        out["GPU busy"] = figures.busy_figure(busy)
    return out


def _svg_colors(svg: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for fill, key in re.findall(r'fill="(#[0-9A-Fa-f]{6})" data-component="([a-z_]+)"', svg):
        found.setdefault(key, set()).add(fill)
    return found


def test_every_chart_draws_a_component_in_its_one_colour(
    cpu_run: AnalysisResult, gpu_run: AnalysisResult, tmp_path: Path
) -> None:
    seen: dict[str, set[str]] = {}
    for run in (cpu_run, gpu_run):
        for chart, fig in _figures(run).items():
            assert _check(fig, seen, chart) > 0, chart
        # the Overview's inline SVG (the dashboard's first screen): rects and legend
        parts = overview.rank_parts(run)
        svg = figures.rank_parts_svg(parts, "t")
        for key, fills in _svg_colors(svg).items():
            assert fills == {COMPONENT_COLORS[key]}, key
            seen.setdefault(key, set()).update(fills)
        for key in parts.keys:
            assert f'fill="{COMPONENT_COLORS[key]}"/><text' in svg  # its legend swatch
    # Compare: each bar in its component's colour, both runs
    cmp = compare(cpu_run, gpu_run)
    headers = overview.metric_headers(cmp.has_gpu_trace)
    keys = list(cmp.table["metric"])
    table = cmp.table.assign(metric=[headers.get(m, m) for m in keys])
    fig = figures.compare_figure(table, "A", "B", keys)
    # the bars' two traces (the legend's two grey entries draw no bar: probe 31m)
    for trace in fig.data[:2]:
        for key, color in zip(keys, trace.marker.color, strict=True):
            want = colours.STEP_COLOR if key.startswith("step_ms") else COMPONENT_COLORS[key]
            assert color == want, (key, color)
            if not key.startswith("step_ms"):
                seen.setdefault(key, set()).add(color)
    # DataParallel's stages (no DP run ships: its stages drawn from the analysis's names)
    dp = figures.dp_figure(dict.fromkeys(STAGES, 1.0), 3.0, 2.0)
    assert list(dp.data[0].marker.color) == [COMPONENT_COLORS[f"dp_{s}"] for s in STAGES]
    # Live: the step is not a component, and no component's colour draws it
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER, run)
    reader = rundir.LiveReader(run)
    window = live.LiveWindow()
    batch = reader.poll()
    window.add(batch)
    snap = live.snapshot(window, batch)
    assert snap.ranks
    _check(figures.live_rank_figure(snap), seen, "live")
    # the all-reduce chart's ranks, bus bandwidth: no component's colour either
    if len(gpu_run.collective_summary):
        _check(figures.busbw_figure(gpu_run.collective_summary), seen, "busbw")
    for res in (cpu_run, gpu_run):
        if len(res.buckets):
            _check(figures.bucket_figure(res.buckets.frame()), seen, "buckets")
    assert {k for k, c in seen.items() if len(c) != 1} == set()
    assert {"compute", "comm_overlapped", "data_loading", "idle", "other"} <= set(seen)


def test_the_html_report_draws_with_the_same_functions(
    cpu_run: AnalysisResult, gpu_run: AnalysisResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[tuple[str, Any]] = []
    for name in ("rank_parts_svg", "timeline_figure"):
        real = getattr(figures, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            fig = _real(*args, **kw)
            built.append((_name, fig))
            return fig

        monkeypatch.setattr(figures, name, spy)
    page = html.render_html([cpu_run, gpu_run])
    assert {n for n, _ in built} == {"rank_parts_svg", "timeline_figure"}
    # the per-rank chart is the dashboard's SVG, every component in its one colour
    for svg in [f for n, f in built if n == "rank_parts_svg"]:
        assert svg in page
        drawn = re.findall(r'fill="(#[0-9a-fA-F]+)" data-component="(\w+)"', svg)
        assert drawn
        assert all(color == component_color(key) for color, key in drawn), drawn
    seen: dict[str, set[str]] = {}
    for name, fig in [(n, f) for n, f in built if n == "timeline_figure"]:
        assert _check(fig, seen, f"html {name}") > 0
        for trace in fig.data:
            color = _trace_color(trace)
            if isinstance(color, str) and trace.name in _names():
                assert color in page
    assert {k for k, c in seen.items() if len(c) != 1} == set()


def test_mapping_is_distinct_and_has_one_fallback() -> None:
    values = [c.lower() for c in COMPONENT_COLORS.values()]
    assert len(values) == len(set(values)), "two components share a colour"
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in values)
    assert FALLBACK_COLOR.lower() not in values
    assert component_color("no_such_component") == FALLBACK_COLOR
    not_components = {
        colours.STEP_COLOR,
        colours.LAST_STEP_COLOR,
        colours.OUTLINE_COLOR,
        colours.MEASURED_COLOR,
        colours.PEAK_COLOR,
        colours.THROTTLE_COLOR,
        *colours.RUN_COLORS,
        *colours.RANK_PALETTE,
    }
    assert not {c.lower() for c in not_components} & set(values)
    # a timeline lane the mapping does not know: the fixed fallback, not plotly's next
    tl = pd.DataFrame(
        {"rank": [0], "lane": ["new_lane"], "start_ms": [0.0], "end_ms": [1.0], "name": ["x"]}
    )
    assert figures.timeline_figure(tl).data[0].line.color == FALLBACK_COLOR


def test_no_chart_code_names_a_colour_of_its_own() -> None:
    """Colours are named in report/colours.py only (html.py's page style and severity
    badges, and the SVG's grid line, are not chart series)."""
    allowed = {"#e5e5e5"}
    for path in [
        REPO / "gpudiag" / "report" / "figures.py",
        REPO / "gpudiag" / "report" / "overview.py",
        *sorted((REPO / "dashboards").glob("*.py")),
    ]:
        text = path.read_text()
        hexes = set(re.findall(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b", text)) - allowed
        assert not hexes, (path.name, hexes)
        assert "px.colors" not in text and "color_discrete_map" not in text, path.name


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour."""

    def linear(u: int) -> float:
        v = u / 255
        return ((v + 0.055) / 1.055) ** 2.4 if v > 0.04045 else v / 12.92

    r, g, b = (linear(int(hex_colour[i : i + 2], 16)) for i in (1, 3, 5))
    x = (r * 0.4124 + g * 0.3576 + b * 0.1805) / 0.95047
    y = r * 0.2126 + g * 0.7152 + b * 0.0722
    z = (r * 0.0193 + g * 0.1192 + b * 0.9505) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return (116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z)))


def test_no_two_component_colours_are_near_each_other() -> None:
    """Probe 31g, defect 8: GPU metrics' compute kernels (#88CCEE) and the Overview's
    overlapped communication (#56B4E9) were two light blues of different meanings
    (CIE76 distance 12.6); DataParallel's reduce_add steel blue was as near. Every pair
    is now at least 18 apart."""
    import itertools
    import math

    named = {**COMPONENT_COLORS, "fallback": FALLBACK_COLOR}
    near = [
        (a, b, round(math.dist(_lab(named[a]), _lab(named[b])), 1))
        for a, b in itertools.combinations(named, 2)
        if math.dist(_lab(named[a]), _lab(named[b])) < 18
    ]
    assert not near, near


def test_metric_series_are_drawn_in_greys_not_plotly_colours(cpu_run: AnalysisResult) -> None:
    """Probe 31g, defect 8: the host and GPU metric lines took plotly's blue and red
    (next to compute's blue); a series that is no component is grey or black."""
    host = cpu_run.host_samples
    assert isinstance(host, pd.DataFrame) and len(host)
    two_nodes = pd.concat([host, host.assign(node=1)])
    fig = figures.host_metric_figure(two_nodes, "cpu_percent", "%")
    drawn = [(t.line.color, t.line.dash) for t in fig.data]
    assert [c for c, _ in drawn] == [colours.SERIES_COLORS[0], colours.SERIES_COLORS[1]]
    assert not set(c for c, _ in drawn) & set(COMPONENT_COLORS.values())
