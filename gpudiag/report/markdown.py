"""A comparison as a short Markdown summary, suited to a pull-request comment."""

from __future__ import annotations

import math

from gpudiag.analysis.compare import Comparison
from gpudiag.report import rank_means
from gpudiag.report.overview import change_side, load_explains_text, metric_headers


def _code(text: str) -> str:
    """Inline code that no run-derived text can break out of."""
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def _plain(text: str) -> str:
    """A warning's text with no Markdown it could carry (backticks, brackets, markup)."""
    return "".join("\\" + ch if ch in "\\`*_[]<>#|" else ch for ch in text.replace("\n", " "))


def _ms(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.2f}"


def _verdict_lines(comparison: Comparison) -> list[str]:
    v = comparison.regression
    if v is None:
        return []
    level = f"{100 * v.confidence:.0f} %"
    head = (
        f"**Regression**: step time {v.change_pct:+.1f} % "
        if v.regressed
        else f"**No regression** beyond {v.threshold_pct:g} %: step time {v.change_pct:+.1f} % "
    )
    return [
        head + f"({level} CI {v.ci_low_pct:+.1f} … {v.ci_high_pct:+.1f} %, "
        f"threshold {v.threshold_pct:g} %, Mann-Whitney p = {v.mann_whitney_p:.3g}).",
        "",
        f"Median step {_ms(v.base_median_ms)} → {_ms(v.new_median_ms)} ms "
        f"(base: {v.base_source}; new: {v.new_source}).",
        "",
        *([load_explains_text(v), ""] if v.load_explains else []),
    ]


def comparison_markdown(comparison: Comparison) -> str:
    lines = [
        "### gpudiag compare",
        "",
        f"base {_code(comparison.a)} → new {_code(comparison.b)}",
        "",
        *_verdict_lines(comparison),
        *(f"> warning: {_plain(w)}\n" for w in comparison.warnings),
        f"| ms/step | base | new | Δ | Δ % | {rank_means.MOST_HEADER_MD} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    headers = metric_headers(comparison.has_gpu_trace)
    for row in comparison.table.to_dict(orient="records"):
        pct = row["delta_pct"]
        pct_text = "–" if not math.isfinite(pct) else f"{pct:+.1f}"
        lines.append(
            f"| {headers.get(row['metric'], row['metric'])} | {_ms(row['a'])} | {_ms(row['b'])} | "
            f"{_ms(row['delta'])} | {pct_text} | {rank_means.most_change_text(row)} |"
        )
    lines += ["", rank_means.compare_means_text("base", "new")]
    moved = comparison.changed_components()
    if moved:
        names = [headers.get(n, n).removesuffix(" ms/step") for n, _ in moved]
        lines += [
            "",
            "Components that moved (ms/step, mean over ranks): "
            + ", ".join(f"{name} {d:+.2f} ms" for name, (_, d) in zip(names, moved, strict=True)),
        ]
    if comparison.finding_changes:
        lines += ["", "Findings that changed:"]
        for c in comparison.finding_changes:
            lines.append(
                f"- {c.kind}: {change_side(c.a, c.ranks_a)} → "
                f"{change_side(c.b, c.ranks_b)} ({c.change})"
            )
    return "\n".join(lines) + "\n"


__all__ = ["comparison_markdown"]
