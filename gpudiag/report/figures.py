"""The plotly figures of every view: the standalone HTML report (report/html.py) and
the Streamlit dashboard (dashboards/views.py) draw with these, so a chart reads the
same in both. Presentation only: built from AnalysisResult frames, with no numbers
derived beyond what a chart needs (sorting, pivoting, unit scaling). The analysis never
imports this module.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from gpudiag.analysis.gpu import PERF_THROTTLE_MASK
from gpudiag.analysis.result import BREAKDOWN_KEYS, LANES

BREAKDOWN_COLORS = {
    "compute": "#4c78a8",
    "comm_overlapped": "#72b7b2",
    "comm_exposed": "#e45756",
    "data_loading": "#f58518",
    "idle": "#bab0ac",
    "other": "#9d755d",
}
LANE_COLORS = {
    "compute": "#4c78a8",
    "communication": "#e45756",
    "data_loading": "#f58518",
    "other": "#9d755d",
    "idle": "#bab0ac",
}
COLORS = {**BREAKDOWN_COLORS, **LANE_COLORS, "step": "#444444"}
# Byte-valued metrics are drawn in GiB (or MiB when small), never as plotly's "1.6B".
_BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_LAYOUT = dict(
    margin=dict(l=10, r=10, t=60, b=10),
    legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
)


def _segments(frame: pd.DataFrame, column: str) -> list:
    """Interval start/end pairs separated by None gaps: one SVG path per lane draws
    thousands of intervals cheaply (no WebGL needed, which headless/remote browsers lack)."""
    out = [None] * (3 * len(frame))
    if column == "x":
        out[0::3] = frame["start_ms"].round(4).tolist()
        out[1::3] = frame["end_ms"].round(4).tolist()
    else:
        values = frame[column].tolist()
        out[0::3] = values
        out[1::3] = values
    return out


def timeline_figure(timeline: pd.DataFrame, title: str = "Timeline") -> go.Figure:
    """One lane group per rank; steps (lane "step", when present) as shaded bands."""
    tl = timeline.copy()
    t0 = float(tl["start_ms"].min()) if len(tl) else 0.0
    tl["start_ms"] -= t0
    tl["end_ms"] -= t0
    ranks = sorted(tl["rank"].unique())
    lane_order = [lane for lane in LANES if lane in set(tl["lane"])]
    lane_order += sorted(set(tl["lane"]) - set(LANES) - {"step"})
    labels = [f"rank {r} · {lane}" for r in ranks for lane in lane_order]
    position = {label: i for i, label in enumerate(reversed(labels))}
    fig = go.Figure()
    for lane in lane_order:
        part = tl[tl["lane"] == lane].copy()
        if part.empty:
            continue
        part["y"] = [position[f"rank {r} · {lane}"] for r in part["rank"]]
        names = part["name"].astype(str) if "name" in part else pd.Series(lane, index=part.index)
        part["hover"] = (
            names + " · " + (part["end_ms"] - part["start_ms"]).round(3).astype(str) + " ms"
        )
        fig.add_trace(
            go.Scatter(
                x=_segments(part, "x"),
                y=_segments(part, "y"),
                text=_segments(part, "hover"),
                mode="lines",
                line=dict(width=10, color=COLORS.get(lane, "#17becf")),
                name=lane,
                hovertemplate="%{text}<br>at %{x:.3f} ms<extra></extra>",
            )
        )
    steps = tl[tl["lane"] == "step"]
    steps = steps[steps["rank"] == steps["rank"].min()] if len(steps) else steps
    for row in steps.head(200).itertuples():
        fig.add_vrect(x0=row.start_ms, x1=row.end_ms, fillcolor=COLORS["step"], opacity=0.06)
    fig.update_yaxes(
        tickvals=list(position.values()), ticktext=list(position.keys()), showgrid=False
    )
    fig.update_xaxes(title="ms since first interval")
    fig.update_layout(
        title=title, height=max(300, 28 * len(labels) + 140), hovermode="closest", **_LAYOUT
    )
    return fig


def rank_breakdown_figure(ranks: pd.DataFrame) -> go.Figure:
    """Stacked bars, one per rank: where the mean step's time goes (``result.ranks``)."""
    fig = go.Figure()
    for key, color in BREAKDOWN_COLORS.items():
        if key in ranks:
            fig.add_bar(
                name=key,
                x=[f"rank {int(r)}" for r in ranks["rank"]],
                y=ranks[key],
                marker_color=color,
            )
    fig.update_layout(
        barmode="stack", title="Step breakdown (ms per step)", yaxis_title="ms", **_LAYOUT
    )
    return fig


def step_breakdown_figure(breakdown: pd.DataFrame, max_bars: int = 400) -> go.Figure:
    """Stacked bars, one per (rank, step) (``result.breakdown``)."""
    bd = breakdown.sort_values(["rank", "step"]).tail(max_bars)
    x = [f"r{r} s{s}" for r, s in zip(bd["rank"], bd["step"], strict=False)]
    fig = go.Figure()
    for key in BREAKDOWN_KEYS:
        if key in bd:
            fig.add_trace(go.Bar(x=x, y=bd[key], name=key, marker_color=COLORS[key]))
    fig.update_layout(
        barmode="stack", title="Step time per rank and step", yaxis_title="ms", **_LAYOUT
    )
    return fig


def busbw_figure(summary: pd.DataFrame) -> go.Figure:
    """Median bus bandwidth per collective and group against the link peak."""
    labels = [f"{op} ({pg})" for op, pg in zip(summary["op"], summary["pg_name"], strict=False)]
    fig = go.Figure(
        go.Bar(x=labels, y=summary["busbw_gbs_median"], name="busbw median", marker_color="#1f77b4")
    )
    if "peak_gbs" in summary and summary["peak_gbs"].notna().any():
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=summary["peak_gbs"],
                mode="markers+lines",
                name="link peak",
                line=dict(dash="dash", color="#d62728"),
            )
        )
    values = pd.concat([summary["busbw_gbs_median"], summary.get("peak_gbs", pd.Series())])
    values = pd.to_numeric(values, errors="coerce").dropna()
    # Measured busbw is often orders of magnitude below the link peak: log axis shows both.
    log = len(values) > 0 and bool((values > 0).all()) and values.max() / values.min() > 50
    if log:
        fig.update_yaxes(type="log", dtick=1)
    fig.update_layout(title="Bus bandwidth vs link peak", yaxis_title="GB/s", **_LAYOUT)
    return fig


def bucket_figure(buckets: pd.DataFrame, start: str, end: str, label: str) -> go.Figure:
    """DDP buckets as horizontal bars on a time axis (ms from the first bucket)."""
    b = buckets.dropna(subset=[start, end]).head(2000).copy()
    t0 = b[start].min()
    b["s"] = (b[start] - t0) / 1e6
    b["d"] = (b[end] - b[start]) / 1e6
    ylab = [f"rank {r}" for r in b["rank"]] if "rank" in b else ["all"] * len(b)
    fig = go.Figure(
        go.Bar(
            x=b["d"],
            base=b["s"],
            y=ylab,
            orientation="h",
            text=b[label].astype(str) if label in b else None,
            marker_color="#1f77b4",
            hovertemplate="bucket %{text}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>",
        )
    )
    fig.update_layout(title="DDP buckets over time", xaxis_title="ms", **_LAYOUT)
    return fig


# The arrival skew's columns skew_heatmap reads (a view reads only these back from disk)
SKEW_HEATMAP_READS = ("pg_name", "seq", "index", "rank", "skew_ms")


def skew_heatmap(skew: pd.DataFrame, max_columns: int = 300) -> go.Figure:
    """Arrival skew (ms behind the first rank) per rank × collective."""
    key = "seq" if "seq" in skew and skew["seq"].notna().any() else "index"
    s = skew.copy()
    s["collective"] = s["pg_name"].astype(str) + ":" + s[key].astype("Int64").astype(str)
    pivot = s.pivot_table(index="rank", columns="collective", values="skew_ms", aggfunc="max")
    order = s.drop_duplicates("collective").sort_values(["pg_name", key])["collective"]
    pivot = pivot.reindex(columns=[c for c in order if c in pivot.columns][:max_columns])
    fig = go.Figure(
        go.Heatmap(
            z=pivot.values,
            x=list(pivot.columns),
            y=[f"rank {r}" for r in pivot.index],
            colorscale="Reds",
            colorbar=dict(title="skew ms"),
        )
    )
    fig.update_layout(
        title="Arrival skew per collective (straggler arrives last)",
        height=max(260, 30 * len(pivot) + 120),
        **_LAYOUT,
    )
    return fig


def throttle_spans(samples: pd.DataFrame) -> list[tuple[float, float]]:
    """Spans (seconds) of consecutive samples whose throttle bits are set."""
    if "throttle_reasons" not in samples:
        return []
    s = samples.sort_values("t_ns")
    flags = (
        pd.to_numeric(s["throttle_reasons"], errors="coerce").fillna(0).astype("int64")
        & PERF_THROTTLE_MASK
    ) != 0
    t = (s["t_ns"] / 1e9).tolist()
    spans, start = [], None
    for ts, on in zip(t, flags.tolist(), strict=False):
        if on and start is None:
            start = ts
        elif not on and start is not None:
            spans.append((start, ts))
            start = None
    if start is not None:
        spans.append((start, t[-1]))
    return spans


def byte_scale(values: pd.Series) -> tuple[str, float]:
    """(unit, divisor) that shows these byte counts as GiB, MiB or KiB."""
    top = pd.to_numeric(values, errors="coerce").abs().max()
    for unit, size in _BYTE_UNITS:
        if pd.notna(top) and top >= size:
            return unit, float(size)
    return "bytes", 1.0


def _scaled(samples: pd.DataFrame, metric: str, unit: str) -> tuple[pd.Series, str]:
    values = pd.to_numeric(samples[metric], errors="coerce")
    if unit != "bytes":
        return values, unit
    shown, size = byte_scale(values)
    return values / size, shown


def gpu_metric_figure(samples: pd.DataFrame, metric: str, unit: str) -> go.Figure:
    """One line per (node, GPU); throttled spans shaded red."""
    fig = go.Figure()
    t0 = samples["t_ns"].min()
    values, unit = _scaled(samples, metric, unit)
    for (node, gpu), part in samples.assign(_y=values).groupby(["node", "gpu"], sort=True):
        part = part.sort_values("t_ns")
        fig.add_trace(
            go.Scattergl(
                x=(part["t_ns"] - t0) / 1e9, y=part["_y"], mode="lines", name=f"n{node} gpu{gpu}"
            )
        )
        for a, b in throttle_spans(part):
            fig.add_vrect(x0=a - t0 / 1e9, x1=b - t0 / 1e9, fillcolor="red", opacity=0.12)
    fig.update_layout(title=f"{metric} ({unit})", xaxis_title="s", yaxis_title=unit, **_LAYOUT)
    return fig


def host_metric_figure(samples: pd.DataFrame, metric: str, unit: str) -> go.Figure:
    fig = go.Figure()
    t0 = samples["t_ns"].min()
    values, unit = _scaled(samples, metric, unit)
    for node, part in samples.assign(_y=values).groupby("node", sort=True):
        part = part.sort_values("t_ns")
        fig.add_trace(
            go.Scattergl(
                x=(part["t_ns"] - t0) / 1e9, y=part["_y"], mode="lines", name=f"node {node}"
            )
        )
    fig.update_layout(title=f"{metric} ({unit})", xaxis_title="s", yaxis_title=unit, **_LAYOUT)
    return fig


def stacked_columns_figure(
    frame: pd.DataFrame, x: str, columns: list[str], title: str
) -> go.Figure:
    fig = go.Figure()
    for col in columns:
        fig.add_trace(go.Bar(x=frame[x].astype(str), y=frame[col], name=col))
    fig.update_layout(barmode="stack", title=title, yaxis_title="ms", **_LAYOUT)
    return fig


def compare_figure(deltas: pd.DataFrame, name_a: str, name_b: str) -> go.Figure:
    """Grouped bars: each component's ms/step in both runs."""
    fig = go.Figure(
        [
            go.Bar(x=deltas["metric"], y=deltas["a"], name=name_a, marker_color="#1f77b4"),
            go.Bar(x=deltas["metric"], y=deltas["b"], name=name_b, marker_color="#ff7f0e"),
        ]
    )
    fig.update_layout(barmode="group", title="ms per step, mean over ranks", **_LAYOUT)
    return fig


def busy_figure(busy: pd.DataFrame) -> go.Figure:
    """Share of the profiled window each rank's GPU runs kernels (and compute only)."""
    x = [f"rank {r}" for r in busy["rank"]]
    fig = go.Figure(
        [
            go.Bar(
                x=x, y=100 * busy["busy_fraction"], name="any kernel/copy", marker_color="#1f77b4"
            ),
            go.Bar(x=x, y=100 * busy["compute_fraction"], name="compute", marker_color="#2ca02c"),
        ]
    )
    fig.update_layout(barmode="group", title="GPU busy (% of window)", yaxis_title="%", **_LAYOUT)
    return fig


def dp_figure(
    stages: dict[str, float], step_ms: float | None, projected: float | None
) -> go.Figure:
    """DataParallel stages per step, beside the measured step and the projected DDP step."""
    fig = go.Figure(go.Bar(x=list(stages), y=list(stages.values()), name="DP stage ms/step"))
    if step_ms is not None:
        fig.add_hline(y=step_ms, line_dash="dash", annotation_text=f"step {step_ms:.2f} ms")
    if projected is not None:
        fig.add_hline(
            y=float(projected),
            line_dash="dot",
            line_color="#2ca02c",
            annotation_text=f"projected DDP step {float(projected):.2f} ms",
        )
    fig.update_layout(title="DataParallel stages (ms per step)", yaxis_title="ms", **_LAYOUT)
    return fig
