"""Rich terminal report: findings first (kind, severity, cost, ranks, evidence, fix,
location), then the per-rank table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpudiag.numfmt import plural
from gpudiag.report import numbers, rank_means, rank_words, wait_note, windows
from gpudiag.report.collective_spread import WALL_TEXT
from gpudiag.report.overview import (
    change_side,
    collective_digits,
    collectives_frame,
    component_labels,
    evidence_lines,
    load_explains_text,
    metric_headers,
    no_findings_text,
    ordered_findings,
)
from gpudiag.report.tables import FINDING_COSTS_TEXT, compare_view, moved_components_text

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
RANK_COLUMNS = (
    ("steps", "steps"),
    ("step_ms_mean", "step ms"),
    ("step_ms_p90", "p90 ms"),
    ("compute", "compute ms"),
    ("comm_overlapped", "comm ovl ms"),
    ("comm_exposed", "comm exp ms"),
    ("comm_wait", "of it waiting ms"),
    ("data_loading", "data ms"),
    ("idle", "idle ms"),
    ("other", "other ms"),
    ("comm_comp_overlap_pct", "overlap %"),
)
# wider than any report line, for measuring a table's natural width
_MEASURE_WIDTH = 1000


def _num(value: Any, digits: int = numbers.MS_DIGITS) -> str:
    return numbers.num(value, digits)


def _evidence_text(evidence: dict[str, Any], limit: int = 8) -> str:
    """The evidence as a person reads it, one item a line (``net wait: rank 2: 39.05
    ms/step``); a per-rank list longer than 8 ranks is cut to its first 8."""
    lines = []
    for line in evidence_lines(dict(list(evidence.items())[:limit])):
        parts = line.split(", rank ")
        if len(parts) > 8:
            line = ", rank ".join(parts[:8]) + f", … ({len(parts)} ranks)"
        lines.append("  " + line)
    return "\n".join(lines)


def _header(result: AnalysisResult) -> Text:
    run = result.run
    text = Text()
    text.append("gpudiag analyze ", style="bold")
    text.append(numbers.terminal_text(str(result.source)))
    bits = [
        f"kind {run.kind}",
        f"world size {run.world_size or '?'}",
        f"backend {run.backend or '?'}",
        windows.analysed_text(result),
        f"ranks traced {run.traced_ranks}",
    ]
    steady = windows.steady_text(result)
    if steady is not None:  # the step every share is of (docs/findings.md), its window said
        bits.insert(3, steady)
    if run.devices:
        bits.append("devices " + ", ".join(run.devices[:3]))
    if run.status:
        bits.append(f"status {run.status}")
    text.append("\n" + numbers.terminal_text(" | ".join(bits)), style="dim")
    slowed = windows.slowdown_note(result)
    if slowed:
        text.append("\nNote: " + numbers.terminal_text(slowed), style="yellow")
    return text


# The order the findings come in (findings.sort_findings, docs/findings.md "Order"): the
# header said "severity, then cost per step" above a cause listed before a costlier
# finding it causes (probe 31l, F3: dataloader_stall 41.47 above straggler 42.81)
FINDINGS_ORDER = (
    "failures first, then severity, then cost per step; a cause just above what it causes"
)


def render_findings(
    console: Console, findings: list[Any], no_findings: str, run: Any = None
) -> None:
    if not findings:
        console.print(Panel(Text(no_findings), title="Findings"))
        return
    console.print(Text(f"Findings ({len(findings)}: {FINDINGS_ORDER})", style="bold"))
    for i, f in enumerate(ordered_findings(findings), 1):
        style = SEVERITY_STYLE.get(f.severity, "")
        head = Text()
        head.append(f"{i}. [{f.severity.upper()}] ", style=style)
        head.append(f"{f.kind}", style="bold")
        head.append(f"  {numbers.ms(f.cost_ms_per_step, 'ms/step')}")
        head.append(f"  {rank_words.finding_ranks(f, run)}")
        body = Text()
        body.append(numbers.terminal_text(f.title) + "\n")
        body.append("evidence:\n", style="dim")
        body.append(numbers.terminal_text(_evidence_text(f.evidence)) + "\n")
        body.append("fix: ", style="green")
        body.append(numbers.terminal_text(f.fix))
        if f.location:
            body.append("\nlocation: ", style="dim")
            body.append(numbers.terminal_text(f.location))
        console.print(Panel(body, title=head, title_align="left", border_style=style or "white"))


def ranks_table(ranks: Any, rank: int | None = None, gpu: bool = False) -> Table | None:
    """Per rank; on a GPU run ``other`` and ``idle`` are named as every view names them
    (no kernel on the device, the host busy or not)."""
    if ranks is None or ranks.empty:
        return None
    if rank is not None:
        ranks = ranks[ranks["rank"] == rank]
    table = Table(
        title="Per rank (ms per step, mean over the profiled steps; overlap: % of comm, waits included)"
    )
    table.add_column("rank", justify="right")
    names = dict(RANK_COLUMNS)
    labels = component_labels(gpu)  # every view's names for these two
    names.update(other=f"{labels['other']} ms", idle=f"{labels['idle']} ms")
    columns = [(k, names[k]) for k, _ in RANK_COLUMNS if k in ranks]
    for _, label in columns:
        table.add_column(label, justify="right")
    for row in ranks.to_dict(orient="records"):
        table.add_row(
            str(int(row["rank"])),
            *(_num(row.get(key), _DIGITS.get(key, 2)) for key, _ in columns),
        )
    return table


_DIGITS = {"steps": 0, "comm_comp_overlap_pct": 1}


def render_ranks(console: Console, ranks: Any, rank: int | None = None, gpu: bool = False) -> None:
    table = ranks_table(ranks, rank, gpu)
    console.print(table if table is not None else "No per-rank step data.")


def collectives_table(summary: Any, wall: Any = None, window: str | None = None) -> Table | None:
    """The collectives table as the HTML report and the dashboard show it."""
    if summary is None or not len(summary):
        return None
    frame = collectives_frame(summary.head(20), wall, window)
    text = numbers.frame_text(frame, collective_digits(frame))
    caption = WALL_TEXT if wall is not None and len(wall) else None
    table = Table(title="Collectives (per op and process group)", caption=caption)
    for c in text.columns:
        table.add_column(str(c), justify="right")
    for row in text.itertuples(index=False):
        table.add_row(*(numbers.terminal_text(str(v)) for v in row))
    return table


def output_console(tables: list[RenderableType | None]) -> Console:
    """A terminal keeps its width (rich wraps to it). Piped or logged output has no width
    to fit: it gets one wide enough for the widest table, so no number is cut."""
    console = Console()
    if console.is_terminal:
        return console
    wide = console.options.update_width(_MEASURE_WIDTH)
    widths = [Measurement.get(console, wide, t).maximum for t in tables if t is not None]
    return Console(width=max([console.width, *widths]))


def print_report(result: Any, *, rank: int | None = None, console: Console | None = None) -> None:
    per_rank = ranks_table(result.ranks, rank, bool(result.run.has_gpu_trace))
    collectives = collectives_table(
        result.collective_summary, result.collective_wall, windows.collective_window(result)
    )
    console = console or output_console([per_rank, collectives])
    console.print(_header(result))
    render_findings(console, result.findings, no_findings_text(result), result.run)
    console.print(per_rank if per_rank is not None else "No per-rank step data.")
    if per_rank is not None and rank is None:
        # the wait the table shows beside the findings that cost it (the chart's note)
        note = wait_note.wait_note(result, f"The table's '{dict(RANK_COLUMNS)['comm_wait']}'")
        if note:
            console.print(Text("Note: " + numbers.terminal_text(note)))
    if collectives is not None:
        console.print(collectives)


def summary_line(result: Any) -> str:
    """One line per run for the end of a multi-run report."""
    counts = {s: sum(f.severity == s for f in result.findings) for s in ("high", "medium", "low")}
    step = result.ranks["step_ms_mean"].astype(float).mean() if len(result.ranks) else math.nan
    ordered = ordered_findings(result.findings)
    top = ordered[0] if ordered else None
    worst = (
        f"; first: {top.kind} {_num(top.cost_ms_per_step)} ms/step ({top.severity})"
        if top is not None
        else ""
    )
    return (
        f"{result.source}: step {_num(step)} ms (mean over ranks), "
        f"{len(result.findings)} finding{'s' if len(result.findings) != 1 else ''} "
        f"({counts['high']} high, {counts['medium']} medium, {counts['low']} low){worst}"
    )


def print_summary(results: list[Any], console: Console | None = None) -> None:
    lines = [summary_line(r) for r in results]
    console = console or Console(width=max([80, *(len(line) for line in lines)]))
    console.print(Text(f"Summary ({len(results)} runs)", style="bold"))
    for line in lines:
        console.print(Text(line), no_wrap=True, overflow="ignore", crop=False)


def _comparison_table(comparison: Any, split: Any, headers: dict[str, str]) -> Table:
    """Compare's metric table: each run's mean over ranks, the change, and each run's
    rank with the most of the metric (probe 31l, F2); ``split`` as every view shows it
    (tables.compare_view)."""
    table = Table(
        title=f"A = {escape(str(comparison.a))}\nB = {escape(str(comparison.b))}",
        caption=rank_means.compare_means_text(),
    )
    columns = ("metric", "A ms/step", "B ms/step", "B − A ms/step", "B − A %")
    for col in (*columns, rank_means.MOST_HEADER):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for row in split.to_dict(orient="records"):
        delta = row["delta"]
        style = "red" if delta > 0 else "green" if delta < 0 else ""
        table.add_row(
            headers.get(row["metric"], row["metric"]),
            _num(row["a"]),
            _num(row["b"]),
            Text(_num(delta), style=style),
            _num(row["delta_pct"], 1),
            rank_means.most_change_text(row),
        )
    return table


def print_comparison(
    comparison: Any, console: Console | None = None, runs: tuple[Any, Any] | None = None
) -> None:
    """The comparison as the dashboard shows it; ``runs`` (A's and B's results) split
    exposed communication into waiting and transfer as the dashboard does."""
    if runs is not None:
        split, headers = compare_view(comparison, *runs)
    else:
        split, headers = comparison.table, metric_headers(comparison.has_gpu_trace)
    table = _comparison_table(comparison, split, headers)
    console = console or output_console([table])
    for line in comparison.warnings:
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    verdict = comparison.regression
    if verdict is not None:
        word = "[bold red]REGRESSION[/]" if verdict.regressed else "[green]no regression[/]"
        console.print(
            f"{word}: median step {verdict.base_median_ms:.2f} -> {verdict.new_median_ms:.2f} ms, "
            f"{verdict.change_pct:+.1f} % ({100 * verdict.confidence:.0f} % CI "
            f"{verdict.ci_low_pct:+.1f} .. {verdict.ci_high_pct:+.1f} %), threshold "
            f"{verdict.threshold_pct:g} %, Mann-Whitney p = {verdict.mann_whitney_p:.3g}; "
            f"A: {verdict.base_source}, B: {verdict.new_source}",
            highlight=False,
        )
        load_words = load_explains_text(verdict)
        if load_words:
            console.print(load_words, highlight=False)
    console.print(table)
    moved = moved_components_text(comparison.changed_components(), split, headers)
    if moved:
        console.print(moved, highlight=False)
    for change in comparison.finding_changes:
        console.print(
            f"finding {change.kind}: {change_side(change.a, change.ranks_a)}"
            f"{_cost_text(change.cost_a_ms)} -> {change_side(change.b, change.ranks_b)}"
            f"{_cost_text(change.cost_b_ms)} ({change.change})",
            highlight=False,
        )
    if comparison.finding_changes:
        console.print(FINDING_COSTS_TEXT, highlight=False)
    console.print(f"findings A: {', '.join(comparison.findings_a) or 'none'}")
    console.print(f"findings B: {', '.join(comparison.findings_b) or 'none'}")


def _cost_text(cost: Any) -> str:
    """`` 37.34 ms/step`` beside a finding's side of a change; nothing where it has none."""
    return f" {numbers.ms(cost, 'ms/step')}" if numbers.number(cost) is not None else ""


def whatif_table(projections: list[Any]) -> Table | None:
    if not projections:
        return None
    table = Table(title="What if: projected step time per fix")
    for col in ("scenario", "finding", "ranks", "step ms", "projected ms", "range ms", "saving"):
        table.add_column(col, justify="left" if col in ("scenario", "finding") else "right")
    for p in projections:
        table.add_row(
            p.scenario,
            p.finding_kind,
            numbers.rank_cell(p.ranks),
            _num(p.step_ms),
            _num(p.projected_step_ms),
            f"{_num(p.projected_low_ms)}–{_num(p.projected_high_ms)}",
            f"{_num(p.saving_ms)} ms ({_num(p.saving_pct, 1)} %)",
        )
    return table


def print_whatif(
    source: Any,
    step_ms: float,
    projections: list[Any],
    console: Console | None = None,
    window_ms: float | None = None,
) -> None:
    """``window_ms``: the profiled window's mean step where ``step_ms`` is the run's
    steady step (the projections start from the steady step)."""
    table = whatif_table(projections)
    console = console or output_console([table])
    if window_ms is None:
        console.print(Text(f"{source}: mean step {_num(step_ms)} ms (profiled window)"))
    else:
        console.print(
            Text(f"{source}: steady step {_num(step_ms)} ms (profiled window {_num(window_ms)} ms)")
        )
    if table is None:
        console.print("No finding with a cost: no fix to project.")
        return
    console.print(table)
    for p in projections:
        console.print(Text(f"{p.scenario}: " + "; ".join(p.assumptions)))


def print_scale(scaled: Any, console: Console | None = None) -> None:
    """`gpudiag whatif --world-size`: the projected step at N ranks, its parts, the fitted
    collective model and the assumptions (a ScaleProjection, gpudiag/analysis/scaling.py)."""
    table = Table(
        title=f"What if: {scaled.from_world_size} -> {scaled.world_size} ranks "
        f"on {plural(scaled.nodes, 'node')} (weak scaling)"
    )
    for col in ("part", "measured ms", "projected ms"):
        table.add_column(col, justify="left" if col == "part" else "right")
    rows = (
        ("step", scaled.step_ms, scaled.projected_step_ms),
        ("compute and host work", scaled.compute_ms, scaled.projected_compute_ms),
        ("exposed communication", scaled.comm_exposed_ms, scaled.projected_comm_exposed_ms),
        ("idle", scaled.idle_ms, scaled.idle_ms),
        ("model: communication", scaled.model_comm_ms, scaled.projected_model_comm_ms),
    )
    for name, a, b in rows:
        table.add_row(name, _num(a), _num(b))
    console = console or output_console([table])
    console.print(table)
    console.print(
        Text(
            f"projected step {_num(scaled.projected_step_ms)} ms "
            f"(range {_num(scaled.projected_low_ms)}–{_num(scaled.projected_high_ms)}), "
            f"{scaled.change_pct:+.1f} % vs {_num(scaled.step_ms)} ms; "
            f"link across nodes: {scaled.inter_node_link}"
        )
    )
    for a in scaled.assumptions:
        console.print(Text(f"- {a}"))
