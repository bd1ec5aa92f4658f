"""A finding's evidence as lines of text, and the cost suffix of its title: each key named
with its unit (``net_wait_ms_per_step`` -> "net wait (ms/step)"), each value formatted as
the tables format it (gpudiag.report.numbers). Used by the terminal, the HTML report and
the dashboard (through gpudiag.report.overview, which re-exports these names)."""

from __future__ import annotations

import re
from typing import Any

from gpudiag.report import numbers

_UNIT_SUFFIXES = (
    ("_ms_per_step", "ms/step"),
    ("_ms", "ms"),
    ("_pct", "%"),
    ("_gbs", "GB/s"),
    ("_mib", "MiB"),
    ("_mb", "MB"),
)


# evidence keys whose words alone would say another view's label (probe 31j, D5: the
# finding's "overlap fraction", waits left out, beside the table's overlap, waits included)
_EVIDENCE_NAMES = {
    # gpu_idle: busy + idle-with-data-loading = 100 %; the cost leaves data loading out
    # (87.8 % busy beside "11.1 % of the step" idle on Megatron: probe 31j, D6)
    # both over all ranks, so they add up to the step (probe 31l, F5: 42.3 % busy, the
    # mean of per-rank shares, beside 8.82 of 15.77 ms idle)
    "kernel_busy_fraction": (
        "GPU busy (any kernel, copy or collective; all ranks' profiled steps together)",
        "share",
    ),
    "gpu_idle_total_ms_per_step": ("GPU idle, data loading included (mean over ranks)", "ms/step"),
    "overlap_fraction": (
        "overlapped share of the transfer (overlapped / (overlapped + transfer), waits left out)",
        "share",
    ),
}


def _evidence_name(key: str) -> tuple[str, str]:
    """(words, unit) of an evidence key: ``net_wait_ms_per_step`` -> (net wait, ms/step)."""
    if key in _EVIDENCE_NAMES:
        return _EVIDENCE_NAMES[key]
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " "), unit
    if key.endswith(("_fraction", "_share")) or key.startswith("share_") or "share_of" in key:
        return key.replace("_", " "), "share"
    if key.endswith("bytes"):
        return key.replace("_", " "), "bytes"
    return key.replace("_", " "), ""


def readable_header(key: str) -> str:
    """A column's key as a header a person reads, with its unit last, as the other
    tables' headers: ``wait_ms_per_step`` -> ``wait ms/step``, ``mean_bucket_mib`` ->
    ``mean bucket MiB``. A header already in words is kept."""
    if "_" not in key:
        return key
    words, unit = _evidence_name(key)
    return f"{words} {unit}" if unit and unit not in ("share", "bytes") else words


def _evidence_value(value: Any, unit: str, who: str = "rank", count: bool = False) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return numbers.NA
    if isinstance(value, (int, float)):
        if unit == "share":
            return numbers.share(value)
        if unit == "bytes":
            return numbers.size(value)
        if unit == "%":
            return numbers.pct(value)
        if isinstance(value, float) and 0 < abs(value) < 0.01 and not unit:
            text = f"{value:.2g}"  # a p-value: its significant digits
        elif not unit and count:  # buckets per step: a count (probe 31f, D7: "2.00")
            text = numbers.count(value)
        else:
            text = numbers.num(value)  # a time, a size: the tables' decimals
        return f"{text} {unit}" if unit and text != numbers.NA else text
    if isinstance(value, dict):
        if value and all(str(k).lstrip("-").isdigit() for k in value):
            return ", ".join(
                f"{who} {k}: {_evidence_value(v, unit, count=count)}" for k, v in value.items()
            )
        parts = []
        for k, v in value.items():
            # a key that is data (an op's name, `aten::_local_scalar_dense`), not a field
            # name, is shown as recorded (browser probe: "aten:: local scalar dense")
            name, inner = (str(k), unit) if "::" in str(k) else _evidence_name(str(k))
            # a part of a whole (``extra_ms_per_step``: data, starved, compute...) is in
            # the whole's unit (probe 31j, D10: "compute: 1.27; blocked: 40.34", no unit)
            inner = inner or unit
            parts.append(f"{name}: {_evidence_value(v, inner, 'node' if 'node' in name else who)}")
        return "; ".join(parts)
    if isinstance(value, (list, tuple)):
        return ", ".join(_evidence_value(v, unit, count=count) for v in value) or numbers.NA
    return _EVIDENCE_WORDS.get(str(value), str(value))


# evidence values that name a column of gpudiag's tables, as a person reads them
_EVIDENCE_WORDS = {
    "median_cost_ms": "the median over the run's steps",
    "cost_ms_per_step": "the mean over the run's steps",
    # dataloader_stall's step_basis: which statistic of which steps its step is (probe
    # 31l, F2: "step of these ranks: 46.16 ms" was in no table and said neither)
    "steady_median": "the rank's median step over its steady steps (warm-up left out)",
    "steady_median_of_ranks": (
        "each rank's median step over its steady steps (warm-up left out), the mean over "
        "these ranks"
    ),
    "profiled_mean": "the rank's mean step over the profiled steps",
    "profiled_mean_of_ranks": "each rank's mean step over the profiled steps, the mean over these ranks",
    "run_steady": "the run's steady step (the step time the run's header gives, with its basis)",
}


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """A finding's evidence as a person reads it, one ``name: value unit`` per item
    (``net wait: rank 2: 39.05 ms/step``), never a Python repr."""
    lines = []
    for key, value in evidence.items():
        name, unit = _evidence_name(str(key))
        who = "node" if "node" in name else "rank"
        per_step = name.endswith(" per step")  # no unit: a count per step
        lines.append(f"{name}: {_evidence_value(value, unit, who, per_step)}")
    return lines


def cost_suffix(finding: Any) -> str:
    """`` (39.05 ms/step)`` after a finding's title, or nothing when the title already
    says that number (probe 31g: "the others wait 39.05 ms per step (39.05 ms/step)")."""
    shown = numbers.num(finding.cost_ms_per_step)
    if shown != numbers.NA and re.search(rf"(?<![\d.]){re.escape(shown)}(?![\d])", finding.title):
        return ""
    return f" ({numbers.ms(finding.cost_ms_per_step, 'ms/step')})"
