"""The windows a report's numbers are over, named where two sit side by side: the steady
step (every recorded step after warm-up) beside the profiled steps the trace numbers
come from. The terminal said "steady step 56.41 ms | 3 steps analysed", and nothing said
that the profiled steps of a run took 40 % longer than its steady step, which inflates
every op-level number measured in them (probe 31m, the unnamed windows)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpudiag.report import numbers, overview

# The profiled steps' median over the steady step's above which the first screen says the
# profiler slowed them: a few per cent is one step's noise, 20 % moves every op's time.
SLOWDOWN_NOTE_SHARE = 0.20


def analysed_text(result: Any) -> str:
    """``3 profiled steps analysed`` (``60 recorded steps`` for a run without traces)."""
    return f"{overview.steps_window(result)} analysed"


def steady_text(result: Any) -> str | None:
    """``steady step 56.41 ms (median over 12 recorded steps after 2 warm-up steps)``:
    the run's step time with its window; None where the run has no steady step."""
    steady = numbers.number(getattr(result.run, "steady_step_ms", None))
    if steady is None:
        return None
    label = overview.step_time(result)[0].removeprefix("steady: ")
    return f"steady step {numbers.ms(steady, 'ms')} ({label})"


def profiled_median(result: Any) -> float | None:
    """The profiled steps' median step: the median over ranks of each rank's median."""
    ranks = result.ranks
    if ranks is None or not len(ranks) or "step_ms_median" not in ranks:
        return None
    return numbers.number(pd.to_numeric(ranks["step_ms_median"], errors="coerce").median())


def slowdown_note(result: Any) -> str:
    """One line where the profiled steps' median is over :data:`SLOWDOWN_NOTE_SHARE`
    longer than the steady step: the numbers measured in them are inflated. Empty
    otherwise, or where the run has no steady step or no traced steps."""
    steady = numbers.number(getattr(result.run, "steady_step_ms", None))
    profiled = profiled_median(result)
    if steady is None or profiled is None or steady <= 0 or not result.run.traced_ranks:
        return ""
    share = profiled / steady - 1.0
    if share <= SLOWDOWN_NOTE_SHARE:
        return ""
    return (
        f"The {overview.steps_window(result)} took {numbers.ms(profiled, 'ms')} (median over "
        f"ranks), {100 * share:.0f} % more than the {steady_text(result)}: the profiler "
        "slows the steps it records, so the per-rank and op-level times measured in them "
        "are inflated against the steady step."
    )


def collective_window(result: Any) -> str | None:
    """The steps the collectives table counts its calls over: ``3 profiled steps`` where
    every call comes from a trace, ``14 recorded steps`` where they come from the run's
    own tables (every step). None where the calls name no step."""
    collectives = getattr(result, "collectives", None)
    if collectives is None or "step" not in collectives or "rank" not in collectives:
        return None
    steps: dict[int, set[int]] = {}
    traced = True
    for piece in collectives.pieces(["rank", "step", "source"]):
        if "source" in piece:
            traced &= bool(piece["source"].astype(str).str.startswith("trace").all())
        for rank, step in piece.dropna(subset=["step"])[["rank", "step"]].itertuples(index=False):
            steps.setdefault(int(rank), set()).add(int(step))
    if not steps:
        return None
    n = max(len(s) for s in steps.values())
    kind = "profiled" if traced else "recorded"
    return f"{n} {kind} step{'s' * (n != 1)}"


def steps_text(frame: pd.DataFrame) -> str | None:
    """``the 3 steps 5-7`` (``steps 5, 9 and 12`` when not consecutive): the steps a
    table of calls holds, so its chart and its table say the same window. None where it
    names none."""
    if "step" not in frame:
        return None
    steps = sorted({int(s) for s in pd.to_numeric(frame["step"], errors="coerce").dropna()})
    if not steps:
        return None
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"the {len(steps)} steps {steps[0]}-{steps[-1]}"
    return f"the {len(steps)} steps {numbers.ranks(steps).removeprefix('ranks ')}"
