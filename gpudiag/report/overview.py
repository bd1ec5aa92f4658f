"""What the first screen says, for every report: the findings in one order, the verdict
line (what, which rank, the ms/step you get back, the fix), and the per-rank step split
into named components, one meaning per label, one colour per component.

Presentation only: every number is one the analysis gave (the per-rank table, the
findings' evidence); nothing is measured or estimated here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpudiag.analysis.findings import SEVERITY_RANK, Finding
from gpudiag.report import numbers

# Failures first (a run that hung is the first thing to know), then by severity, then by
# cost: the order of the terminal report, the HTML report and the dashboard alike.
_FAILURE_ORDER = {"rank_failed": 0, "hang": 1, "desync": 2}


def _failure_order(f: Finding) -> int:
    if f.kind == "desync" and isinstance(f.evidence, dict) and "mismatch" in f.evidence:
        return -1
    return _FAILURE_ORDER.get(f.kind, 9)


def ordered_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Failures, then severity (high, medium, low), then cost (largest first)."""

    def cost(f: Finding) -> float:
        v = numbers.number(f.cost_ms_per_step)
        return v if v is not None else 0.0

    return sorted(
        findings, key=lambda f: (_failure_order(f), SEVERITY_RANK.get(f.severity, 3), -cost(f))
    )


# --------------------------------------------------------------------------- components

# One colour per component, in every chart (the dashboard's and the HTML report's).
COMPONENT_COLORS = {
    "compute": "#4c78a8",
    "comm_overlapped": "#72b7b2",
    "comm_wait": "#e45756",
    "comm_transfer": "#ff9da6",
    "comm_exposed": "#e45756",
    "data_loading": "#f58518",
    "other": "#9d755d",
    "idle": "#bab0ac",
}
# Stacking order, bottom up.
COMPONENTS = (
    "compute",
    "comm_overlapped",
    "comm_transfer",
    "comm_exposed",
    "comm_wait",
    "data_loading",
    "other",
    "idle",
)


def component_labels(gpu: bool, waited_for: list[int] | None = None) -> dict[str, str]:
    """The name of each component of the per-rank step. On a GPU run the breakdown's
    ``other`` and ``idle`` are both time with no kernel on the device (the host busy, or
    nothing at all): together they are what the gpu_idle finding calls GPU idle."""
    waiting = (
        f"waiting for {numbers.ranks(waited_for)}" if waited_for else "waiting for peers to arrive"
    )
    labels = {
        "compute": "GPU compute (kernels, copies)" if gpu else "compute (an op running)",
        "comm_overlapped": "communication, overlapped",
        "comm_wait": waiting,
        "comm_transfer": "transfer (exposed communication)",
        "comm_exposed": "exposed communication",
        "data_loading": "data loading" + (" (GPU idle)" if gpu else ""),
        "other": "GPU idle · host busy" if gpu else "host busy, no op (Python, sleeps)",
        "idle": "GPU idle · host idle" if gpu else "idle (nothing running)",
    }
    return labels


@dataclass(frozen=True)
class RankParts:
    """The per-rank step split for the first-screen chart: ``frame`` has ``rank``,
    ``step_ms`` (mean over the profiled steps) and one column per component key present
    (:data:`COMPONENTS`, ms per step), ``labels`` names each key, ``named`` are the
    ranks the top finding names (highlighted)."""

    frame: pd.DataFrame
    labels: dict[str, str]
    named: list[int]
    split: bool  # exposed communication split into waiting and transfer

    @property
    def keys(self) -> list[str]:
        return [k for k in COMPONENTS if k in self.frame]


def _finding(findings: Iterable[Finding], kind: str) -> Finding | None:
    return next((f for f in findings if f.kind == kind), None)


def _per_rank(evidence: dict[str, Any], key: str) -> dict[int, float] | None:
    values = evidence.get(key)
    if not isinstance(values, dict):
        return None
    out: dict[int, float] = {}
    for rank, value in values.items():
        v = numbers.number(value)
        if v is None:
            return None
        try:
            out[int(rank)] = v
        except (TypeError, ValueError):
            return None
    return out


def rank_parts(result: Any) -> RankParts:
    """The per-rank table's components, exposed communication split into the wait for
    late peers (the exposed_communication finding's per-rank measure) and the transfer
    (the rest of the same rank's exposed time)."""
    ranks: pd.DataFrame = result.ranks
    findings = ordered_findings(result.findings)
    top = findings[0] if findings else None
    straggler = _finding(findings, "straggler")
    named = [int(r) for r in top.ranks] if top is not None and len(top.ranks) < len(ranks) else []
    gpu = bool(result.run.has_gpu_trace)
    labels = component_labels(gpu, [int(r) for r in straggler.ranks] if straggler else None)
    cols = ["rank", "step_ms_mean", *(k for k in COMPONENTS if k in ranks)]
    frame = ranks[[c for c in cols if c in ranks]].rename(columns={"step_ms_mean": "step_ms"})
    frame = frame.copy()
    exposed = _finding(findings, "exposed_communication")
    wait = _per_rank(exposed.evidence, "per_rank_waiting_for_peers_ms") if exposed else None
    split = bool(wait) and "comm_exposed" in frame
    if split and wait is not None:
        waits = frame["rank"].astype(int).map(wait)
        if waits.isna().any():
            split = False
        else:
            exposed_ms = frame["comm_exposed"].astype(float)
            frame["comm_wait"] = waits.clip(lower=0.0).combine(exposed_ms, min)
            frame["comm_transfer"] = exposed_ms - frame["comm_wait"]
            frame = frame.drop(columns="comm_exposed")
    frame["rank"] = frame["rank"].astype(int)
    return RankParts(frame=frame.reset_index(drop=True), labels=labels, named=named, split=split)


# --------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    level: str  # "error" | "warning" | "info" | "success"
    headline: str  # one line: what, which rank, ms/step back
    fix: str  # the fix, as the finding gives it
    finding: Finding | None


_LEVEL = {"high": "error", "medium": "warning", "low": "info"}


def first_sentence(text: str) -> str:
    head = text.split(". ")[0].strip()
    return head if head.endswith(".") else head + "."


def _fix_text(f: Finding) -> str:
    """The finding's fix; a straggler's begins with a sentence that explains, not fixes."""
    fix = f.fix.strip()
    if f.kind == "straggler" and ". " in fix:
        fix = fix.split(". ", 1)[1]
    return fix


def verdict(result: Any) -> Verdict:
    """The top finding as one line a reader takes in at a glance."""
    findings = ordered_findings(result.findings)
    if not findings:
        return Verdict("success", "Healthy: no bottleneck found.", "", None)
    f = findings[0]
    step = numbers.number(result.step_ms)
    cost = numbers.ms(f.cost_ms_per_step, "ms/step")
    of_step = f" of {numbers.ms(step)}" if step else ""
    who = numbers.ranks(f.ranks) if f.ranks else "all ranks"
    evidence = f.evidence if isinstance(f.evidence, dict) else {}
    if f.kind == "straggler":
        head = (
            f"{who[0].upper()}{who[1:]} is the straggler: the other ranks wait for it "
            f"{cost} (you get back up to {cost}{of_step})."
        )
    elif f.kind == "gpu_idle":
        busy, still = evidence.get("host_busy_ms_per_step"), evidence.get("host_idle_ms_per_step")
        parts = (
            f"host busy {numbers.ms(busy)} + host idle {numbers.ms(still)}"
            if numbers.number(busy) is not None and numbers.number(still) is not None
            else "the 'GPU idle · host busy' and 'GPU idle · host idle' columns"
        )
        head = (
            f"GPU idle {cost}{of_step} (mean over ranks: {parts}), worst on {who}: "
            f"up to {cost} back."
        )
    elif f.kind == "exposed_communication":
        head = (
            f"Exposed communication transfer {cost}{of_step} on {who} (the wait for late "
            "peers set apart): what better overlap gives back."
        )
    else:
        head = f"{f.title} ({who}): up to {cost} back{of_step}."
    return Verdict(_LEVEL.get(f.severity, "info"), head, _fix_text(f), f)


# --------------------------------------------------------------------------- tables

RANK_HEADERS = {
    "rank": "rank",
    "steps": "steps",
    "step_ms_mean": "step ms (mean)",  # over the profiled steps: the page's title says so
    "step_ms_median": "step ms (median)",
    "step_ms_p90": "step ms (p90)",
    "compute": "compute ms/step",
    "comm_overlapped": "comm overlapped ms/step",
    "comm_exposed": "comm exposed ms/step",
    "data_loading": "data loading ms/step",
    "idle": "idle ms/step",
    "other": "other ms/step",
    "comm_comp_overlap_pct": "overlap % of comm (comm_comp_overlap_pct)",
}
RANK_DIGITS = {"rank": 0, "steps": 0, "comm_comp_overlap_pct": 1}


def rank_table(result: Any) -> pd.DataFrame:
    """The per-rank table with a unit in every header; on a GPU run ``other`` and
    ``idle`` named as the chart names them."""
    ranks: pd.DataFrame = result.ranks
    headers = dict(RANK_HEADERS)
    if result.run.has_gpu_trace:
        headers["other"] = "GPU idle · host busy ms/step"
        headers["idle"] = "GPU idle · host idle ms/step"
    else:
        headers["other"] = "host busy, no op ms/step"
    return ranks.rename(columns=headers)


def rank_table_digits() -> dict[str, int]:
    """Decimals of the per-rank table's columns that are not milliseconds."""
    return {RANK_HEADERS[c]: d for c, d in RANK_DIGITS.items()}


# The collectives summary's columns, each header with its unit. ``bytes`` is the median
# size of one call; ``total_ms`` the sum of the calls' durations per rank (overlapping
# calls counted each: not wall time).
COLLECTIVE_HEADERS = {
    "op": "op",
    "pg_name": "group",
    "count": "calls/rank",
    "bytes": "size (median per call)",
    "total_ms": "sum of call durations ms/rank",
    "wall_ms_per_step": "wall ms/step",
    "busbw_gbs_median": "busbw GB/s (median)",
    "peak_gbs": "link peak GB/s",
    "ranks": "ranks",
}


def collectives_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """The collectives summary for a table: sizes in MiB, a unit in every header."""
    out = summary.copy()
    if "bytes" in out:
        out["bytes"] = pd.to_numeric(out["bytes"], errors="coerce") / 2**20
    headers = {**COLLECTIVE_HEADERS, "bytes": "MiB (median per call)"}
    return out.rename(columns=headers)


WINDOW_PROFILED = "profiled steps"
WINDOW_EVERY = "every recorded step"


def step_time(result: Any) -> tuple[str, str]:
    """(label, value) of the run's step time: the steady step (median over every step
    after warm-up) when the analysis gives it, else the mean over the profiled steps;
    the label names the window."""
    steady = numbers.number(getattr(result.run, "steady_step_ms", None))
    if steady is not None:
        return f"steady: median over {WINDOW_EVERY} after warm-up", numbers.ms(steady)
    step = numbers.number(result.step_ms)
    return f"mean over the {steps_window(result)}", numbers.ms(step)


def steps_window(result: Any) -> str:
    """``3 profiled steps`` (traces), or ``60 recorded steps`` (a run without traces,
    judged on its steps table)."""
    n = result.run.steps_analysed
    kind = "profiled" if result.run.traced_ranks else "recorded"
    return f"{n} {kind} step{'s' * (n != 1)}"


__all__ = [
    "COMPONENTS",
    "COMPONENT_COLORS",
    "RANK_HEADERS",
    "RankParts",
    "Verdict",
    "component_labels",
    "ordered_findings",
    "rank_parts",
    "rank_table",
    "step_time",
    "verdict",
]


# --------------------------------------------------------------------------- evidence

_UNIT_SUFFIXES = (
    ("_ms_per_step", "ms/step"),
    ("_ms", "ms"),
    ("_pct", "%"),
    ("_gbs", "GB/s"),
    ("_mb", "MB"),
)


def _evidence_name(key: str) -> tuple[str, str]:
    """(words, unit) of an evidence key: ``net_wait_ms_per_step`` -> (net wait, ms/step)."""
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " "), unit
    if key.endswith(("_fraction", "_share")) or key.startswith("share_") or "share_of" in key:
        return key.replace("_", " "), "share"
    if key.endswith("bytes"):
        return key.replace("_", " "), "bytes"
    return key.replace("_", " "), ""


def _evidence_value(value: Any, unit: str, who: str = "rank") -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return numbers.NA
    if isinstance(value, (int, float)):
        if unit == "share":
            return numbers.share(value)
        if unit == "bytes":
            return numbers.size(value)
        if isinstance(value, float) and 0 < abs(value) < 0.01:
            text = f"{value:.2g}"  # a p-value, a tiny time: its significant digits
        else:
            text = numbers.num(value)
        return f"{text} {unit}" if unit and text != numbers.NA else text
    if isinstance(value, dict):
        if value and all(str(k).lstrip("-").isdigit() for k in value):
            return ", ".join(f"{who} {k}: {_evidence_value(v, unit)}" for k, v in value.items())
        parts = []
        for k, v in value.items():
            name, inner = _evidence_name(str(k))
            parts.append(f"{name}: {_evidence_value(v, inner, 'node' if 'node' in name else who)}")
        return "; ".join(parts)
    if isinstance(value, (list, tuple)):
        return ", ".join(_evidence_value(v, unit) for v in value) or numbers.NA
    return str(value)


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """A finding's evidence as a person reads it, one ``name: value unit`` per item
    (``net wait: rank 2: 39.05 ms/step``), never a Python repr."""
    lines = []
    for key, value in evidence.items():
        name, unit = _evidence_name(str(key))
        who = "node" if "node" in name else "rank"
        lines.append(f"{name}: {_evidence_value(value, unit, who)}")
    return lines
