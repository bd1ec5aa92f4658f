"""Standalone HTML report: plotly.js inlined once, so the file opens offline.

Charts (gpudiag/report/figures.py, the same the dashboard draws): stacked step
breakdown per rank, and the per-rank timeline. Findings and the per-rank table as plain
HTML tables (all text escaped).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.report import figures
from gpudiag.report.tables import whatif_frame

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult

SEVERITY_COLORS = {"high": "#c0392b", "medium": "#d68910", "low": "#2e86c1"}

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td.l,th.l{text-align:left}.sev{color:#fff;padding:2px 6px;border-radius:3px;font-weight:bold}
.finding{border-left:4px solid #888;padding:.5em 1em;margin:1em 0;background:#fafafa}
code{background:#eee;padding:1px 4px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _findings_html(findings: list[Any]) -> str:
    if not findings:
        return "<p>No findings: nothing costs a noticeable share of the step.</p>"
    parts = []
    for f in findings:
        color = SEVERITY_COLORS.get(f.severity, "#888")
        evidence = "".join(f"<li><code>{_e(k)}</code>: {_e(v)}</li>" for k, v in f.evidence.items())
        loc = f"<p>location: <code>{_e(f.location)}</code></p>" if f.location else ""
        parts.append(
            f'<div class="finding" style="border-color:{color}">'
            f'<span class="sev" style="background:{color}">{_e(f.severity.upper())}</span> '
            f"<b>{_e(f.kind)}</b> — {f.cost_ms_per_step:.2f} ms/step — ranks {_e(f.ranks)}"
            f"<p>{_e(f.title)}</p><ul>{evidence}</ul><p><b>fix:</b> {_e(f.fix)}</p>{loc}</div>"
        )
    return "\n".join(parts)


def _frame_html(frame: Any) -> str:
    if frame is None or frame.empty:
        return "<p>(none)</p>"
    return frame.to_html(index=False, float_format=lambda v: f"{v:.3f}", border=0, escape=True)


TIMELINE_INTERVALS = 4000


def _whatif_html(result: AnalysisResult) -> str:
    if not result.whatif:
        return ""
    return (
        f"<h2>What if: projected step time per fix</h2>{_frame_html(whatif_frame(result.whatif))}"
    )


def _timeline_title(result: AnalysisResult) -> str:
    drawn = result.timeline_ranks()
    if drawn is None:
        return "Timeline"
    return (
        f"Timeline: {len(drawn)} of {len(result.run.traced_ranks)} ranks (those named by "
        "findings, then the slowest and the fastest)"
    )


def _result_section(result: AnalysisResult, include_js: bool) -> str:
    from plotly.io import to_html

    figs = [figures.rank_breakdown_figure(result.ranks)]
    timeline = result.timeline(max_intervals=TIMELINE_INTERVALS)
    if len(timeline):
        figs.append(figures.timeline_figure(timeline, _timeline_title(result)))
    charts = []
    for i, fig in enumerate(figs):
        charts.append(to_html(fig, full_html=False, include_plotlyjs=(include_js and i == 0)))
    run = result.run
    warnings = "".join(f"<li>{_e(w)}</li>" for w in result.warnings)
    return (
        f"<h1>gpudiag: {_e(result.source)}</h1>"
        f"<p>{_e(run.kind)} · world size {_e(run.world_size)} · backend "
        f"{_e(run.backend)} · {_e(run.steps_analysed)} steps analysed · devices "
        f"{_e(', '.join(run.devices) or 'CPU')}</p>"
        f"<h2>Findings</h2>{_findings_html(result.findings)}"
        + _whatif_html(result)
        + f"<h2>Per rank (ms per step; comm_comp_overlap_pct: % of communication overlapped "
        f"with compute)</h2>{_frame_html(result.ranks)}"
        + "".join(charts)
        + f"<h2>Collectives</h2>{_frame_html(result.collective_summary)}"
        + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "")
    )


def render_html(results: list[AnalysisResult]) -> str:
    body = "<hr>".join(_result_section(r, include_js=(i == 0)) for i, r in enumerate(results))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>gpudiag report</title>"
        f"<style>{CSS}</style></head><body>{body}</body></html>"
    )


def write_html(results: list[AnalysisResult] | AnalysisResult, path: Path) -> Path:
    if not isinstance(results, list):
        results = [results]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(results), encoding="utf-8")
    return path
