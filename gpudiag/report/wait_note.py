"""The chart's wait for late peers beside the findings that cost it, in one line, where no
finding costs it at the size drawn.

On the DLRM GPU set the chart drew 5.62 ms/step of "waiting for late peers" (rank 1's bar
10.85 ms) above a verdict about GPU idle, and the only finding about waiting was a low
straggler of 1.21 ms/step: nothing on the page said why the two differ (probe 31m, F2).
They count different things: every rank waits from its own arrival at a collective until
the last rank's, while a straggler's cost is only the last rank's lead over the
next-latest one (analysis/stragglers.py); the rest of the wait is the spread of the
arrivals before it, which no one rank causes. The dashboard, the HTML report and the
terminal print this same line (the terminal names its table's column instead of the
chart's part)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpudiag.report import numbers, overview

# The findings whose cost is a part of the drawn wait (a straggler's lead, the small sync
# calls' latency). exposed_communication is not one: its cost is the transfer, the wait
# set apart.
_WAIT_FINDINGS = ("straggler", "sync_point")
# The drawn wait needs a line when it is over this many times the largest of those costs
# and at least this share of the drawn step (a few per cent is the noise of one step).
_OVER = 1.5
_SHARE = 0.05


def _drawn_wait(result: Any) -> pd.Series | None:
    """The chart's 'waiting for late peers' per rank (indexed by rank), None where the
    chart does not split it out."""
    try:
        parts = overview.rank_parts(result)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    if not parts.split or "comm_wait" not in parts.frame:
        return None
    wait = pd.to_numeric(parts.frame["comm_wait"], errors="coerce")
    wait.index = [int(r) for r in parts.frame["rank"]]
    return wait.dropna()


def _unclaimed(result: Any) -> tuple[pd.Series, list[Any]] | None:
    """The drawn wait and the findings that cost a part of it, where the wait's mean
    over ranks is over :data:`_OVER` times the largest of their costs and at least
    :data:`_SHARE` of the mean drawn step. None where the findings account for it."""
    wait = _drawn_wait(result)
    if wait is None or wait.empty:
        return None
    steps = pd.to_numeric(result.ranks.get("step_ms_mean"), errors="coerce")
    step = numbers.number(steps.mean()) if steps is not None else None
    mean = float(wait.mean())
    if step is None or mean < _SHARE * step:
        return None
    claims = [f for f in overview.ordered_findings(result.findings) if f.kind in _WAIT_FINDINGS]
    largest = max((numbers.number(f.cost_ms_per_step) or 0.0 for f in claims), default=0.0)
    return (wait, claims) if mean > _OVER * largest else None


def _claim_words(f: Any) -> str:
    cost = numbers.ms(f.cost_ms_per_step, "ms/step")
    if f.kind == "straggler":
        who = numbers.ranks(f.ranks) if f.ranks else "the late rank"
        return (
            f"the straggler finding's {cost} counts only {who}'s lead over the next-latest "
            "rank to arrive"
        )
    return f"the {f.kind} finding's {cost} counts the small sync calls' latency"


def _late_words(result: Any) -> str:
    """``(last to arrive: rank 7 at 5 collectives, rank 5 at 2, rank 4 at 1)`` from the
    straggler finding's evidence, the ranks that came last at least once."""
    for f in overview.ordered_findings(result.findings):
        arrivals = (f.evidence or {}).get("last_arrivals") if f.kind == "straggler" else None
        if not isinstance(arrivals, dict):
            continue
        late = sorted(
            ((int(n), int(r)) for r, n in arrivals.items() if numbers.number(n)), reverse=True
        )
        if len(late) > 1:
            said = [f"rank {r} at {n} collective{'s' * (n != 1)}" for n, r in late[:1]]
            said += [f"rank {r} at {n}" for n, r in late[1:4]]
            more = ", ..." if len(late) > 4 else ""
            return f" (last to arrive: {', '.join(said)}{more})"
    return ""


def wait_note(result: Any, name: str | None = None) -> str:
    """One line tying the drawn wait to the findings that cost it, where they cost
    much less (:func:`_unclaimed`); empty otherwise. ``name`` is how the view names the
    wait (the chart's part by default)."""
    found = _unclaimed(result)
    if found is None:
        return ""
    wait, claims = found
    if name is None:
        name = f"The chart's '{overview.run_labels(result)['comm_wait']}'"
    low, high = int(wait.idxmin()), int(wait.idxmax())
    drawn = (
        f"{numbers.ms(wait.mean(), 'ms')} per step, the mean over {overview.ranks_words(result, wait.index)} "
        f"(from {numbers.ms(wait[low])} on rank {low} to {numbers.ms(wait[high])} on rank {high}"
        f"), each rank's the mean over the {overview.steps_window(result)}"
    )
    costs = "; ".join(_claim_words(f) for f in claims)
    why = (
        f"{costs}. The rest is the spread of the arrivals before the last one over several "
        f"ranks{_late_words(result)}, not attributable to one late rank"
        if claims
        else "no rank arrives last often enough, or late enough, to be named a straggler: "
        "the wait is spread over the ranks, not attributable to one late rank"
    )
    return (
        f"{name} is {drawn}, more than any finding costs: each rank waits at a collective from its own arrival "
        f"until the last rank's, and {why}."
    )


def page_note(result: Any, verdict: overview.Verdict) -> str:
    """The verdict's chart note and, where no note ties the drawn wait to its findings
    already (a straggler verdict's own notes, or the note on the chart's largest part),
    :func:`wait_note`: what the dashboard and the HTML report print under the chart."""
    f = verdict.finding
    tied = f is not None and (
        f.kind == "straggler" or overview.larger_part(result, f) == "comm_wait"
    )
    extra = "" if tied else wait_note(result)
    return " ".join(n for n in (verdict.chart_note, extra) if n)
