"""The plotly figures of every view: the standalone HTML report (report/html.py) and
the Streamlit dashboard (dashboards/views.py) draw with these, so a chart reads the
same in both. Presentation only: built from AnalysisResult frames, with no numbers
derived beyond what a chart needs (sorting, pivoting, unit scaling). The analysis never
imports this module.
"""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.graph_objects as go

from gpudiag.analysis.gpu import PERF_THROTTLE_MASK
from gpudiag.analysis.live_snapshot import LiveSnapshot
from gpudiag.analysis.result import BREAKDOWN_KEYS, LANES
from gpudiag.report import colours, numbers
from gpudiag.report.colours import component_color
from gpudiag.report.overview import COMPUTE_KERNELS, GPU_BUSY, RankParts, component_labels

# Every component's colour comes from colours.COMPONENT_COLORS through component_color
# (one colour per component in every chart, the HTML report's and the dashboard's).
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


MAX_STEP_BANDS = 200  # steps shaded in the timeline (each band is one SVG shape)


def timeline_figure(
    timeline: pd.DataFrame, title: str = "Timeline", gpu: bool = False
) -> go.Figure:
    """One lane group per rank; steps (lane "step", when present) as shaded bands. Lanes
    are named as the Overview's chart names the components (its raw keys, "other" and
    "idle", were a third vocabulary: fourth browser probe of issue 31)."""
    # the lanes' ticks short (long ones narrowed the plot: probe 31j, D3); the legend says
    # what the communication lane holds
    names_of = {**component_labels(gpu), "communication": "communication"}
    tl = timeline.copy()
    t0 = float(tl["start_ms"].min()) if len(tl) else 0.0
    tl["start_ms"] -= t0
    tl["end_ms"] -= t0
    ranks = sorted(tl["rank"].unique())
    lane_order = [lane for lane in LANES if lane in set(tl["lane"])]
    lane_order += sorted(set(tl["lane"]) - set(LANES) - {"step"})
    labels = [f"rank {r} · {names_of.get(lane, lane)}" for r in ranks for lane in lane_order]
    position = {label: i for i, label in enumerate(reversed(labels))}
    fig = go.Figure()
    for lane in lane_order:
        part = tl[tl["lane"] == lane].copy()
        if part.empty:
            continue
        part["y"] = [position[f"rank {r} · {names_of.get(lane, lane)}"] for r in part["rank"]]
        names = part["name"].map(_p) if "name" in part else pd.Series(_p(lane), index=part.index)
        part["hover"] = (
            names + " · " + (part["end_ms"] - part["start_ms"]).round(3).astype(str) + " ms"
        )
        fig.add_trace(
            go.Scatter(
                x=_segments(part, "x"),
                y=_segments(part, "y"),
                text=_segments(part, "hover"),
                mode="lines",
                line=dict(width=10, color=component_color(lane)),
                name=_p(TIMELINE_COMMUNICATION if lane == "communication" else names_of[lane])
                if lane in names_of
                else _p(lane),
                hovertemplate="%{text}<br>at %{x:.3f} ms<extra></extra>",
            )
        )
    steps = tl[tl["lane"] == "step"]
    steps = steps[steps["rank"] == steps["rank"].min()] if len(steps) else steps
    if len(steps) > MAX_STEP_BANDS:  # the bands left out, said in the title
        title += f" (steps shaded: the first {MAX_STEP_BANDS} of {len(steps):,})"
    for row in steps.head(MAX_STEP_BANDS).itertuples():
        fig.add_vrect(x0=row.start_ms, x1=row.end_ms, fillcolor=colours.STEP_COLOR, opacity=0.06)
    fig.update_yaxes(
        tickvals=list(position.values()), ticktext=[_p(k) for k in position], showgrid=False
    )
    fig.update_xaxes(title="ms since first interval")
    fig.update_layout(
        title=title, height=max(300, 28 * len(labels) + 140), hovermode="closest", **_LAYOUT
    )
    # the legend from the left, clear of the modebar at the top right (its first entry was
    # drawn under the zoom icons at 1280 px: probe 31j, D3)
    fig.update_layout(legend=dict(xanchor="left", x=0.0), margin=dict(t=80))
    return fig


# The timeline's one communication lane: every collective's interval whole (its wait for
# late peers, its transfer, overlapped with compute or not), which the trace's intervals
# do not split; its own colour, not one of the Overview's split parts (probe 31j, D3).
TIMELINE_COMMUNICATION = "communication (waiting + transfer, overlapped or not)"


def rank_parts_figure(parts: RankParts, title: str | None = None) -> go.Figure:
    """Stacked bars, one per rank: where the step goes (:func:`overview.rank_parts`),
    exposed communication split into the wait for the named rank and the transfer; the
    ranks the top finding names outlined."""
    fig = go.Figure()
    frame = parts.frame
    x = [rank_tick(int(r), parts.named) for r in frame["rank"]]
    outline = [2.5 if int(r) in parts.named else 0.0 for r in frame["rank"]]
    for key in parts.keys:
        fig.add_bar(
            name=parts.labels[key],
            x=x,
            y=frame[key],
            marker=dict(
                color=component_color(key), line=dict(color=colours.OUTLINE_COLOR, width=outline)
            ),
            customdata=[parts.label(key, int(r)) for r in frame["rank"]],
            hovertemplate="%{x} · %{customdata}: %{y:.2f} ms/step<extra></extra>",
        )
    fig.update_layout(
        barmode="stack",
        title=title or "Where each rank's step goes (ms per step)",
        yaxis_title="ms per step",
        **_LAYOUT,
    )
    return fig


def rank_tick(rank: int, named: list[int]) -> str:
    return f"rank {rank} ◀" if rank in named else f"rank {rank}"


def _nice_step(top: float, ticks: int = 5) -> float:
    raw = top / ticks if top > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def rank_parts_svg(parts: RankParts, title: str, width: int = 1100, height: int = 330) -> str:
    """The same chart as :func:`rank_parts_figure` as one inline SVG (no script to load,
    so it is on the first screen as soon as the page's text is): hover a segment for its
    value."""
    frame = parts.frame
    keys = parts.keys
    n = max(len(frame), 1)
    legend_rows = _legend_rows([(parts.labels[k], k) for k in keys], width - 20)
    top_pad, left, right, bottom = 34 + 20 * len(legend_rows), 56, 12, 34
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    totals = frame[keys].sum(axis=1) if keys else pd.Series([0.0])
    top = float(totals.max()) if len(totals) and numbers.number(totals.max()) else 1.0
    step = _nice_step(top)
    y_max = step * math.ceil(top / step) if top > 0 else 1.0
    scale = plot_h / y_max
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{_x(title)}" class="gpudiag-rank-parts" '
        'style="font-family:sans-serif;font-size:12px;max-width:1100px">',
        f'<text x="0" y="16" font-size="15" font-weight="600">{_x(title)}</text>',
    ]
    for i, row in enumerate(legend_rows):
        x = 0.0
        for label, key in row:
            y_text = 34 + 20 * i
            out.append(
                f'<rect x="{x:.0f}" y="{y_text - 10}" width="12" height="12" '
                f'fill="{component_color(key)}"/><text x="{x + 16:.0f}" y="{y_text}">{_x(label)}</text>'
            )
            x += 28 + 6.5 * len(label)
    for k in range(int(round(y_max / step)) + 1):
        value = k * step
        y = top_pad + plot_h - value * scale
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{numbers.num(value, 0 if step >= 1 else 1)}</text>'
        )
    out.append(
        f'<text x="12" y="{top_pad + plot_h / 2:.0f}" transform="rotate(-90 12 '
        f'{top_pad + plot_h / 2:.0f})" text-anchor="middle">ms per step</text>'
    )
    band = plot_w / n
    bar = min(band * 0.7, 90.0)
    for i, row in enumerate(frame.itertuples(index=False)):
        rank = int(row.rank)
        cx = left + band * (i + 0.5)
        base = float(top_pad + plot_h)
        named = rank in parts.named
        for key in keys:
            value = numbers.number(getattr(row, key)) or 0.0
            h = value * scale
            if h <= 0:
                continue
            base -= h
            out.append(
                f'<rect x="{cx - bar / 2:.1f}" y="{base:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{component_color(key)}" data-component="{key}" data-rank="{rank}" '
                f'data-ms="{value:.4f}"><title>rank {rank} · {_x(parts.label(key, rank))}: '
                f"{numbers.ms(value, 'ms/step')}</title></rect>"
            )
        total = numbers.number(row.step_ms)
        out.append(
            f'<text x="{cx:.1f}" y="{base - 4:.1f}" text-anchor="middle">{numbers.num(total)}</text>'
        )
        if named:
            out.append(
                f'<rect x="{cx - bar / 2 - 2:.1f}" y="{base - 2:.1f}" width="{bar + 4:.1f}" '
                f'height="{top_pad + plot_h - base + 2:.1f}" fill="none" stroke="{colours.OUTLINE_COLOR}" '
                'stroke-width="2.5" class="named-rank"/>'
            )
        weight = ' font-weight="700"' if named else ""
        if n <= 32 or i % math.ceil(n / 32) == 0 or named:
            out.append(
                f'<text x="{cx:.1f}" y="{height - 14}" text-anchor="middle"{weight}>'
                f"{_x(rank_tick(rank, parts.named))}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _legend_rows(items: list[tuple[str, str]], width: float) -> list[list[tuple[str, str]]]:
    """Legend entries (label, key) laid out in rows that fit ``width``."""
    rows: list[list[tuple[str, str]]] = [[]]
    used = 0.0
    for label, key in items:
        need = 28 + 6.5 * len(label)
        if rows[-1] and used + need > width:
            rows.append([])
            used = 0.0
        rows[-1].append((label, key))
        used += need
    return rows


def _x(text: str) -> str:
    return html.escape(str(text), quote=True)


def _p(text: object) -> str:
    """Text from a run (its folder's name, a trace's kernel, thread or process group
    names) for plotly, which reads `<b>`, `<br>`, `<a>` in names, ticks and hover text as
    markup (probe 31h, D6; a kernel's template arguments `<4, ...>` were cut): `&`, `<`
    and `>` as the entities plotly turns back into those characters."""
    return html.escape(str(text), quote=False)


_SPLIT = {"comm_exposed": ("comm_exposed", "comm_transfer", "comm_wait")}


def step_breakdown_figure(
    breakdown: pd.DataFrame, max_bars: int = 400, labels: dict[str, str] | None = None
) -> go.Figure:
    """Stacked bars, one per (rank, step) (``result.breakdown``), each component named
    as the Overview names it (``labels``, :func:`overview.component_labels`)."""
    bd = breakdown.sort_values(["rank", "step"]).tail(max_bars)
    x = [f"r{r} s{s}" for r, s in zip(bd["rank"], bd["step"], strict=False)]
    names = labels or {}
    fig = go.Figure()
    # exposed communication drawn whole, or split as the Overview splits it
    # (:func:`overview.step_parts`: waiting for late peers, transfer)
    keys = [k for key in BREAKDOWN_KEYS for k in _SPLIT.get(key, (key,))]
    for key in keys:
        if key in bd:
            fig.add_trace(
                go.Bar(x=x, y=bd[key], name=names.get(key, key), marker_color=component_color(key))
            )
    fig.update_layout(
        barmode="stack", title="Step time per rank and step", yaxis_title="ms", **_LAYOUT
    )
    # the legend's rows (eight parts with the split wait) above the plot, the title above
    # them: at the default margin the rows ran over the title
    fig.update_layout(margin_t=110, title=dict(y=0.98, yanchor="top", yref="container"))
    return fig


def busbw_figure(summary: pd.DataFrame) -> go.Figure:
    """Median bus bandwidth per collective and group against the link peak."""
    labels = [f"{op} ({pg})" for op, pg in zip(summary["op"], summary["pg_name"], strict=False)]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=summary["busbw_gbs_median"],
            name="busbw median",
            marker_color=colours.MEASURED_COLOR,
        )
    )
    if "peak_gbs" in summary and summary["peak_gbs"].notna().any():
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=summary["peak_gbs"],
                mode="markers+lines",
                name="link peak",
                line=dict(dash="dash", color=colours.PEAK_COLOR),
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


# Lanes of the all-reduce chart drawn at once: past about ten, lanes and their labels
# overlapped (a Megatron TP step has 84 calls on 8 ranks: probe N9). A step of more calls
# is drawn ten at a time (the dashboard picks which; the HTML report draws the first).
LANES_PER_PAGE = 10
GROUPED_RANKS = 8  # bucket_figure: up to this many ranks side by side in a lane


def bucket_lanes(buckets: pd.DataFrame) -> int:
    """The calls per step :func:`bucket_figure` has a lane for (timed calls only)."""
    timed = buckets.dropna(subset=["start_ms", "dur_ms"])
    return int(timed["bucket"].max()) + 1 if len(timed) else 0


def bucket_pages(buckets: pd.DataFrame, per_page: int = LANES_PER_PAGE) -> list[int]:
    """The first lane of each page of :func:`bucket_figure` (``[0]`` when one page)."""
    return list(range(0, max(bucket_lanes(buckets), 1), per_page))


def bucket_page_name(first: int, lanes: int, per_page: int = LANES_PER_PAGE) -> str:
    """``calls #10–#19``: the lanes of the page starting at ``first``."""
    last = min(first + per_page, lanes) - 1
    return f"call #{first}" if last <= first else f"calls #{first}–#{last}"


def bucket_shown_text(
    buckets: pd.DataFrame, first: int = 0, per_page: int = LANES_PER_PAGE
) -> str | None:
    """What :func:`bucket_figure` leaves out, in words (its title and the dashboard's
    caption say the same): "showing calls #0–#9 of 84 per step (10 at a time)"; None when
    it draws every call."""
    lanes = bucket_lanes(buckets)
    if lanes <= per_page:
        return None
    return f"showing {bucket_page_name(first, lanes, per_page)} of {lanes} per step ({per_page} at a time)"


def bucket_figure(
    buckets: pd.DataFrame, first: int = 0, per_page: int = LANES_PER_PAGE
) -> go.Figure:
    """All-reduces per step, one lane per call in issue order (``bucket``), each drawn
    from its start in the step (``start_ms``) for its duration (``dur_ms``), one colour
    per rank, the ranks side by side in a lane (up to :data:`GROUPED_RANKS`; more share
    it); every step of a lane overlaid, so a lane's spread is the variation over steps.
    No text on the bars (hover for values). ``per_page`` lanes from call ``first`` are
    drawn; the title says so when calls are left out (:func:`bucket_shown_text`)."""
    left_out = bucket_shown_text(buckets, first, per_page)
    b = buckets.dropna(subset=["start_ms", "dur_ms"])
    b = b[(b["bucket"] >= first) & (b["bucket"] < first + per_page)]
    fig = go.Figure()
    ranks = sorted(b["rank"].unique()) if "rank" in b else []
    for i, rank in enumerate(ranks):
        part = b[b["rank"] == rank]
        rank_color, pattern = colours.rank_style(i)
        fig.add_trace(
            go.Bar(
                x=part["dur_ms"],
                base=part["start_ms"],
                y=[f"#{int(k)}" for k in part["bucket"]],
                orientation="h",
                name=f"rank {int(rank)}",
                marker=dict(color=rank_color, pattern=dict(shape=pattern)),
                opacity=0.6,
                customdata=part[["step"]].to_numpy() if "step" in part else None,
                hovertemplate=f"rank {int(rank)} · call %{{y}} · step %{{customdata[0]}}<br>"
                "starts %{base:.2f} ms into the step, lasts %{x:.2f} ms<extra></extra>",
            )
        )
    lanes = max(min(bucket_lanes(buckets), first + per_page) - first, 1)
    order = [f"#{k}" for k in range(first, first + lanes)]
    fig.update_yaxes(
        type="category",  # "#3" is a call's name: plotly read the lanes as numbers 0-9
        categoryorder="array",
        categoryarray=order[::-1],
        title="call in the step (issue order)",
        # half a lane of room above the top lane and below the last (lane #0's top bar
        # was cut at the plot's edge at 8 ranks: probe 31j, D9)
        range=[-0.8, lanes - 0.2],
    )
    fig.update_xaxes(title="ms from the step's first all-reduce")
    grouped = len(ranks) <= GROUPED_RANKS
    lane_px = 10 + 6 * len(ranks) if grouped else 18
    fig.update_layout(
        title="All-reduces per step, one lane per call"
        + (f"<br><sup>{left_out}</sup>" if left_out else ""),
        barmode="group" if grouped else "overlay",
        bargap=0.25,
        height=max(260, lane_px * lanes + 160),
        **_LAYOUT,
    )
    if left_out:  # room for the title's second line
        fig.update_layout(margin_t=80)
    return fig


# The arrival skew's columns skew_heatmap reads (a view reads only these back from disk)
SKEW_HEATMAP_READS = ("pg_name", "seq", "index", "rank", "skew_ms")


MAX_SKEW_COLUMNS = 300


def skew_shown_text(shown: int, total: int) -> str | None:
    """What :func:`skew_heatmap` leaves out, in words (its title and the dashboard's
    caption): "showing 300 of 1,344 collectives: the first 300 by process group and
    call order"; None when it draws them all."""
    if total <= shown:
        return None
    return (
        f"showing {shown:,} of {total:,} collectives: the first {shown:,} by process group "
        "and call order"
    )


def _skew_pivot(skew: pd.DataFrame) -> tuple[str, pd.DataFrame, list[str]]:
    key = "seq" if "seq" in skew and skew["seq"].notna().any() else "index"
    s = skew.copy()
    s["collective"] = s["pg_name"].astype(str) + ":" + s[key].astype("Int64").astype(str)
    pivot = s.pivot_table(index="rank", columns="collective", values="skew_ms", aggfunc="max")
    order = s.drop_duplicates("collective").sort_values(["pg_name", key])["collective"]
    return key, pivot, [c for c in order if c in pivot.columns]


def skew_columns(skew: pd.DataFrame) -> int:
    """The collectives :func:`skew_heatmap` has a column for before it keeps the first
    ``max_columns``."""
    return len(_skew_pivot(skew)[2]) if len(skew) else 0


SKEW_TITLE = "Arrival skew: ms each rank arrives after the first, per collective"
SKEW_FIRST = "0.00 ms: the first to arrive"
_NO_EXTRA = "<extra></extra>"


def skew_heatmap(skew: pd.DataFrame, max_columns: int = MAX_SKEW_COLUMNS) -> go.Figure:
    """Arrival skew (ms behind the first rank) per rank × collective: the first
    ``max_columns`` collectives by process group and sequence number; the title says so
    when some are left out (:func:`skew_shown_text`)."""
    key, pivot, columns = _skew_pivot(skew)
    left_out = skew_shown_text(max_columns, len(columns))
    pivot = pivot.reindex(columns=columns[:max_columns])
    fig = go.Figure(
        go.Heatmap(
            z=pivot.values,
            x=[_p(c) for c in pivot.columns],
            y=[f"rank {r}" for r in pivot.index],
            colorscale="Reds",
            colorbar=dict(title="ms after<br>the first"),
            # the value is a time after the first rank to arrive, never a count or an
            # order: "arrived: 0" read as "no rank arrived" (probe N3)
            hovertemplate="%{y} · collective %{x}<br>arrived %{z:.2f} ms after the first "
            f"rank to arrive ({SKEW_FIRST}){_NO_EXTRA}",
        )
    )
    # the rule on a line of its own: on one line the title ran past the chart's right
    # edge and was cut ("...by process group and call orde": probe 31f, D9)
    fig.update_layout(
        title=SKEW_TITLE + (f"<br><sup>{left_out}</sup>" if left_out else ""),
        xaxis_title=(
            "collective (process group : sequence number)"
            if key == "seq"
            else "collective (process group : order of the call)"
        ),
        height=max(260, 30 * len(pivot) + 120),
        **_LAYOUT,
    )
    if left_out:  # room for the title's second line
        fig.update_layout(margin_t=80)
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


# a sampled metric's field as a chart title says it (the unit is added after it)
GPU_METRIC_WORDS = {
    "util_gpu": "GPU utilisation",
    "sm_clock_mhz": "SM clock",
    "power_w": "GPU power",
    "mem_used": "GPU memory used",
    "temp_c": "GPU temperature",
    "pcie_tx_kbs": "PCIe sent",
    "nvlink_tx_kbs": "NVLink sent",
}
HOST_METRIC_WORDS = {
    "cpu_percent": "host CPU busy",
    "proc_cpu_percent": "training processes' CPU",
    "mem_used": "host memory used",
    "proc_rss": "training processes' resident memory",
}


def metric_title(metric: str, unit: str, host: bool = False) -> str:
    """``host CPU busy (% of all cores)``: the field in words, then its unit."""
    words = (HOST_METRIC_WORDS if host else GPU_METRIC_WORDS).get(metric, metric.replace("_", " "))
    return f"{words} ({unit})"


# Up to this many samples a metric chart is drawn as SVG. Each WebGL chart holds one of
# the browser's few WebGL contexts (Chromium: 16): the GPU metrics view's 11 charts
# left the utilisation and SM-clock charts blank ("Too many active WebGL contexts",
# probe 32). Longer runs keep WebGL, which draws many points fast.
SVG_MAX_POINTS = 50_000


def _line_trace(points: int) -> type[go.Scatter] | type[go.Scattergl]:
    return go.Scatter if points <= SVG_MAX_POINTS else go.Scattergl


def gpu_metric_figure(samples: pd.DataFrame, metric: str, unit: str) -> go.Figure:
    """One line per (node, GPU); throttled spans shaded grey."""
    fig = go.Figure()
    t0 = samples["t_ns"].min()
    values, unit = _scaled(samples, metric, unit)
    groups = samples.assign(_y=values).groupby(["node", "gpu"], sort=True)
    for index, ((node, gpu), part) in enumerate(groups):
        part = part.sort_values("t_ns")
        fig.add_trace(
            _line_trace(len(samples))(
                x=(part["t_ns"] - t0) / 1e9,
                y=part["_y"],
                mode="lines",
                name=f"n{node} gpu{gpu}",
                line=colours.series_line(index),
            )
        )
        for a, b in throttle_spans(part):
            fig.add_vrect(
                x0=a - t0 / 1e9, x1=b - t0 / 1e9, fillcolor=colours.THROTTLE_COLOR, opacity=0.12
            )
    fig.update_layout(
        title=metric_title(metric, unit), xaxis_title="s", yaxis_title=unit, **_LAYOUT
    )
    return fig


def host_metric_figure(samples: pd.DataFrame, metric: str, unit: str) -> go.Figure:
    fig = go.Figure()
    t0 = samples["t_ns"].min()
    values, unit = _scaled(samples, metric, unit)
    for index, (node, part) in enumerate(samples.assign(_y=values).groupby("node", sort=True)):
        part = part.sort_values("t_ns")
        fig.add_trace(
            _line_trace(len(samples))(
                x=(part["t_ns"] - t0) / 1e9,
                y=part["_y"],
                mode="lines",
                name=f"node {node}",
                line=colours.series_line(index),
            )
        )
    fig.update_layout(
        title=metric_title(metric, unit, host=True), xaxis_title="s", yaxis_title=unit, **_LAYOUT
    )
    return fig


def stacked_columns_figure(
    frame: pd.DataFrame,
    x: str,
    columns: list[str],
    title: str,
    barmode: str = "stack",
    colors: list[str] | None = None,
) -> go.Figure:
    """Bars of ``columns`` (none of them a component: Compare's per-rank step of runs A and
    B, the lint findings' cost), in ``colors`` or the neutral measure colour."""
    fig = go.Figure()
    for i, col in enumerate(columns):
        color = colors[i % len(colors)] if colors else colours.MEASURED_COLOR
        fig.add_trace(go.Bar(x=frame[x].map(_p), y=frame[col], name=_p(col), marker_color=color))
    fig.update_layout(barmode=barmode, title=title, yaxis_title="ms", **_LAYOUT)
    return fig


def compare_figure(
    deltas: pd.DataFrame, name_a: str, name_b: str, keys: list[str] | None = None
) -> go.Figure:
    """Grouped bars: each component's ms/step in both runs. With ``keys`` (the metric
    key of each row: ``step_ms_mean``, ``compute``, ...) each bar has its component's
    colour, run A hatched and paler, run B solid; without, the two runs' neutral colours."""
    if keys is None:
        a_color: str | list[str] = colours.RUN_COLORS[0]
        b_color: str | list[str] = colours.RUN_COLORS[1]
        a_marker: dict[str, object] = dict(color=a_color)
    else:
        b_color = [
            colours.STEP_COLOR if k.startswith("step_ms") else component_color(k) for k in keys
        ]
        a_marker = dict(color=b_color, opacity=0.55, pattern=dict(shape="/"))
    legend = keys is None  # one colour per run: the bars' own legend entries are right
    fig = go.Figure(
        [
            go.Bar(
                x=deltas["metric"],
                y=deltas["a"],
                name=f"A: {_p(name_a)}",
                marker=a_marker,
                offsetgroup="a",
                showlegend=legend,
            ),
            go.Bar(
                x=deltas["metric"],
                y=deltas["b"],
                name=f"B: {_p(name_b)}",
                marker_color=b_color,
                offsetgroup="b",
                showlegend=legend,
            ),
        ]
    )
    if not legend:
        # bars of many colours: a legend swatch shows one, the first bar's (the step's
        # near-black, beside bars of every component's colour: probe 31m). The legend
        # shows each run's style instead, hatched and pale (A) or solid (B), in grey.
        for name, marker, group in (
            (f"A: {_p(name_a)}", {**a_marker, "color": colours.MEASURED_COLOR}, "a"),
            (f"B: {_p(name_b)}", {"color": colours.MEASURED_COLOR}, "b"),
        ):
            fig.add_trace(go.Bar(x=[None], y=[None], name=name, marker=marker, offsetgroup=group))
    fig.update_layout(barmode="group", title="ms per step, mean over ranks", **_LAYOUT)
    return fig


def busy_figure(busy: pd.DataFrame) -> go.Figure:
    """Share of the profiled window each rank's GPU runs kernels (and compute only)."""
    x = [f"rank {r}" for r in busy["rank"]]
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=100 * busy["busy_fraction"],
                name=GPU_BUSY,
                marker_color=component_color("gpu_busy"),
            ),
            go.Bar(
                x=x,
                y=100 * busy["compute_fraction"],
                name=COMPUTE_KERNELS,
                marker_color=component_color("compute_kernels"),
            ),
        ]
    )
    fig.update_layout(barmode="group", title="GPU busy (% of window)", yaxis_title="%", **_LAYOUT)
    return fig


def dp_figure(
    stages: dict[str, float], step_ms: float | None, projected: float | None
) -> go.Figure:
    """DataParallel stages per step, beside the measured step and the projected DDP step."""
    fig = go.Figure(
        go.Bar(
            x=list(stages),
            y=list(stages.values()),
            name="DP stage ms/step",
            marker_color=[component_color(f"dp_{stage}") for stage in stages],
        )
    )
    if step_ms is not None:
        fig.add_hline(y=step_ms, line_dash="dash", annotation_text=f"step {step_ms:.2f} ms")
    if projected is not None:
        fig.add_hline(
            y=float(projected),
            line_dash="dot",
            line_color=colours.PEAK_COLOR,
            annotation_text=f"projected DDP step {float(projected):.2f} ms",
        )
    fig.update_layout(title="DataParallel stages (ms per step)", yaxis_title="ms", **_LAYOUT)
    return fig


LIVE_LATE = "late at collectives (mean after the first rank)"
LIVE_REST = "rest of the step"


def live_rank_figure(snap: LiveSnapshot) -> go.Figure:
    """Live: each rank's median step over the recent window, split into its data loading
    (the median data wait) and the rest, beside how late it arrives at collectives (mean
    after the first rank, the lagging window), the lagging ranks outlined; its last step
    (markers), ms. The step alone cannot tell the lagging rank: the others' steps hold
    their wait for it, so its bar was the shorter one (probe 31j, D8). The table under it
    has the same numbers."""
    x = [rank_tick(r.rank, snap.lagging) for r in snap.ranks]
    outline = [2.5 if r.rank in snap.lagging else 0.0 for r in snap.ranks]
    data = [r.data_wait_ms or 0.0 for r in snap.ranks]
    rest = [
        None if r.median_step_ms is None else max(r.median_step_ms - d, 0.0)
        for r, d in zip(snap.ranks, data, strict=True)
    ]
    line = dict(color=colours.OUTLINE_COLOR, width=outline)
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=data,
                name=component_labels(False)["data_loading"],
                offsetgroup="step",
                marker=dict(color=component_color("data_loading"), line=line),
                hovertemplate="%{x}: data wait %{y:.2f} ms (median)<extra></extra>",
            ),
            go.Bar(
                x=x,
                y=rest,
                base=data,
                name=f"{LIVE_REST} (median step, last {snap.window_steps} steps)",
                offsetgroup="step",
                marker=dict(color=colours.STEP_COLOR, line=line),
                hovertemplate="%{x}: rest of the median step %{y:.2f} ms<extra></extra>",
            ),
            go.Bar(
                x=x,
                y=[r.late_ms for r in snap.ranks],
                name=LIVE_LATE,
                offsetgroup="late",
                marker=dict(color=colours.MEASURED_COLOR, pattern=dict(shape="/"), line=line),
                hovertemplate="%{x}: late at collectives %{y:.2f} ms<extra></extra>",
            ),
            go.Scatter(
                x=x,
                y=[r.last_step_ms for r in snap.ranks],
                mode="markers",
                name="last step",
                marker=dict(color=colours.LAST_STEP_COLOR, size=10, symbol="diamond"),
                hovertemplate="%{x}: last step %{y:.2f} ms<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title="Per rank (ms; ◀ lagging): median step = data loading + rest; late at collectives",
        yaxis_title="ms",
        barmode="group",
        height=340,
        **_LAYOUT,
    )
    return fig
