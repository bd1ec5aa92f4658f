"""Standalone HTML report: plotly.js inlined once, so the file opens offline.

Charts (gpudiag/report/figures.py, the same the dashboard draws): stacked step
breakdown per rank (the dashboard's inline SVG, bar totals printed), and the per-rank
timeline. Findings and the per-rank table as plain
HTML tables (all text escaped).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.report import figures, numbers, overview, rank_words, wait_note, windows
from gpudiag.report.collective_spread import WALL_TEXT
from gpudiag.report.overview import evidence_lines, no_findings_text, ordered_findings
from gpudiag.report.tables import WHATIF_DIGITS, whatif_frame

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult

SEVERITY_COLORS = {"high": "#c0392b", "medium": "#d68910", "low": "#2e86c1"}

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td.l,th.l{text-align:left}.sev{color:#fff;padding:2px 6px;border-radius:3px;font-weight:bold}
.finding{border-left:4px solid #888;padding:.5em 1em;margin:1em 0;background:#fafafa}
code{background:#eee;padding:1px 4px}.verdict{font-size:1.15em;background:#fdecea;padding:.6em 1em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _findings_html(findings: list[Any], no_findings: str, run: Any = None) -> str:
    if not findings:
        return f"<p>{_e(no_findings)}</p>"
    parts = []
    for f in ordered_findings(findings):
        color = SEVERITY_COLORS.get(f.severity, "#888")
        evidence = "".join(f"<li>{_e(line)}</li>" for line in evidence_lines(f.evidence))
        loc = f"<p>location: <code>{_e(f.location)}</code></p>" if f.location else ""
        parts.append(
            f'<div class="finding" style="border-color:{color}">'
            f'<span class="sev" style="background:{color}">{_e(f.severity.upper())}</span> '
            f"<b>{_e(f.kind)}</b> — {_e(numbers.ms(f.cost_ms_per_step, 'ms/step'))} — "
            f"{_e(rank_words.finding_ranks(f, run))}"
            f"<p>{_e(f.title)}</p><ul>{evidence}</ul><p><b>fix:</b> {_e(f.fix)}</p>{loc}</div>"
        )
    return "\n".join(parts)


def _frame_html(frame: Any, digits: dict[str, int] | None = None) -> str:
    if frame is None or frame.empty:
        return "<p>(none)</p>"
    shown = numbers.frame_text(frame, digits)
    return shown.to_html(index=False, border=0, escape=True)


TIMELINE_INTERVALS = 4000


def _whatif_html(result: AnalysisResult) -> str:
    if not result.whatif:
        return ""
    return f"<h2>What if: projected step time per fix</h2>{_frame_html(whatif_frame(result.whatif), WHATIF_DIGITS)}"


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

    verdict = overview.verdict(result)
    figs = []
    charts = []
    if len(result.ranks):
        # the dashboard's own figure, bar totals printed, the named ranks' whole bars
        # outlined: the plotly one had neither, under a caption that quotes the totals
        # (probe 31l, F6); its text escaped by rank_parts_svg
        title = overview.rank_chart_title(result)
        charts.append(figures.rank_parts_svg(overview.rank_parts(result), title))
    timeline = result.timeline(max_intervals=TIMELINE_INTERVALS)
    if len(timeline):
        figs.append(
            figures.timeline_figure(
                timeline, _timeline_title(result), bool(result.run.has_gpu_trace)
            )
        )
    for i, fig in enumerate(figs):
        charts.append(to_html(fig, full_html=False, include_plotlyjs=(include_js and i == 0)))
    run = result.run
    collectives = overview.collectives_frame(
        result.collective_summary, result.collective_wall, windows.collective_window(result)
    )
    warnings = "".join(f"<li>{_e(w)}</li>" for w in result.warnings)
    return (
        f"<h1>gpudiag: {_e(result.source)}</h1>"
        f"<p>{_e(run.kind)} · world size {_e(run.world_size)} · backend "
        f"{_e(run.backend)} · {_e(windows.analysed_text(result))} · devices "
        f"{_e(overview.devices_text(run))} · {_e(_step_text(result))}</p>"
        + (f"<p class='note'>{_e(slowed)}</p>" if (slowed := windows.slowdown_note(result)) else "")
        + _problems_html(result)
        + f"<p class='verdict'><b>{_e(verdict.headline)}</b>"
        + (f"<br><b>Fix:</b> {_e(verdict.fix)}" if verdict.fix else "")
        + "</p>"
        + "".join(charts[:1])
        + (
            f"<p class='note'>{_e(note)}</p>"
            if (note := wait_note.page_note(result, verdict))
            else ""
        )
        + f"<h2>Findings</h2>{_findings_html(result.findings, no_findings_text(result), result.run)}"
        + _whatif_html(result)
        + "<h2>Per rank (ms per step, mean over the profiled steps)</h2>"
        + _frame_html(overview.rank_table(result), overview.rank_table_digits())
        + "".join(charts[1:])
        + "<h2>Collectives</h2>"
        + _frame_html(collectives, overview.collective_digits(collectives))
        + (f"<p class='note'>{_e(WALL_TEXT)}</p>" if len(result.collective_wall) else "")
        + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "")
    )


def _step_text(result: AnalysisResult) -> str:
    """The steady step with its window, else the profiled steps' mean with its own."""
    steady = windows.steady_text(result)
    return steady if steady is not None else " ".join(overview.step_time(result)[::-1])


def _problems_html(result: AnalysisResult) -> str:
    line = overview.reading_problems(result)
    return f"<p class='problems'><b>Read with problems:</b> {_e(line)}</p>" if line else ""


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
