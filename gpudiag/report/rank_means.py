"""Words for a number that is a mean over ranks, so that no view quotes one without
saying so (probe 31l, F2: "which took 49.13 ms" beside bars of 48.61 and 49.64, the
compare's "data loading ms/step 22.02 → 5.38" where rank 1 waits 43.58 and rank 0 0.46).
Each helper is given the per-rank values the number is the mean of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from gpudiag.analysis.compare import most_rank
from gpudiag.report import numbers

MEAN_OVER_RANKS = "mean over ranks"
# More ranks than this: the least and the most rank, not every rank
_LISTED = 4


def spread_text(values: Mapping[Any, Any], unit: str = "ms") -> str:
    """``rank 0: 48.61 ms, rank 1: 49.64 ms``; above four ranks ``from 13.06 ms (rank 2)
    to 50.85 ms (rank 3)``; empty when no rank has a number."""
    known = {r: float(v) for r, v in values.items() if numbers.number(v) is not None}
    if not known:
        return ""
    if len(known) <= _LISTED:
        return numbers.per_rank(known, unit)
    low = min(known, key=lambda r: (known[r], r))
    high = min((r for r in known if known[r] == max(known.values())), key=int)
    tail = f" {unit}" if unit else ""
    return (
        f"from {numbers.num(known[low])}{tail} (rank {low}) "
        f"to {numbers.num(known[high])}{tail} (rank {high})"
    )


def mean_over_ranks(values: Mapping[Any, Any], unit: str = "ms") -> str:
    """``the mean over ranks; rank 0: 48.61 ms, rank 1: 49.64 ms`` (one rank: empty)."""
    known = [v for v in values.values() if numbers.number(v) is not None]
    if len(known) < 2:
        return ""
    return f"the {MEAN_OVER_RANKS}; {spread_text(values, unit)}"


MOST_HEADER = "most rank, A → B"
MOST_HEADER_MD = "most rank, base → new"


def most_text(value: Any, rank: Any) -> str:
    """``43.58 (rank 1)`` (as the collectives table writes a rank's wall), or the dash."""
    if numbers.number(value) is None or numbers.number(rank) is None:
        return numbers.NA
    return f"{numbers.num(value)} (rank {int(float(str(rank)))})"


def most_change_text(row: Mapping[str, Any]) -> str:
    """A compare row's rank with the most in each run: ``43.58 (rank 1) → 10.44 (rank 1)``
    (the dash where neither run has one: the steady step, a run-wide median)."""
    a = most_text(row.get("a_most"), row.get("a_most_rank"))
    b = most_text(row.get("b_most"), row.get("b_most_rank"))
    return numbers.NA if a == b == numbers.NA else f"{a} → {b}"


def compare_means_text(a: str = "A", b: str = "B") -> str:
    """What compare's numbers are, said under its table in every view."""
    return (
        f"{a} and {b}: the mean over ranks of each run's per-rank table (its profiled "
        "steps), the steady step the run's median step after warm-up; beside them the rank with the most "
        f"of each, {a} → {b} (the mean hides a rank that carries it alone)."
    )


def most_columns(a: pd.DataFrame, b: pd.DataFrame, key: str) -> dict[str, Any]:
    """A compare row's ``a_most``.. columns for ``key`` of two per-rank frames (with a
    ``rank`` column): the rows the dashboard splits out of exposed communication."""
    (va, ra), (vb, rb) = (most_rank(f[key], f["rank"]) for f in (a, b))
    return {"a_most": va, "a_most_rank": ra, "b_most": vb, "b_most_rank": rb}
