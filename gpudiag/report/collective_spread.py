"""The spread over ranks of the collectives table's wall time (probe 31l, F1): the table
gives one wall ms/step per op and group, the mean over ranks, which in a straggler job
matches no rank (the waiting rank's all-reduce 42 ms, the straggler's 0.7: mean 21.39).
Beside the mean, the rank with the least and the rank with the most, each with its wall
(from comms.collective_wall_per_step's ``op_wall_*`` columns), in every view alike."""

from __future__ import annotations

import pandas as pd

from gpudiag.report import numbers

WALL_MEAN = "wall ms/step (mean over ranks)"
WALL_LEAST = "least rank ms/step"
WALL_MOST = "most rank ms/step"
SPREAD = ("op_wall_ms_min", "op_wall_min_rank", "op_wall_ms_max", "op_wall_max_rank")
# What the table's caption says of its wall columns (dashboard, HTML, terminal)
WALL_TEXT = (
    "Wall ms/step: the time the calls take per step, calls in flight together counted "
    "once, the mean over ranks; beside it the rank with the most and the one with the "
    "least (in a straggler job the others wait in the collective the straggler reaches "
    "last, so they differ most there). The sum of call durations (also the mean over "
    "ranks) counts each call, so it can exceed the step."
)


def rank_wall_text(wall_ms: object, rank: object) -> str:
    """``42.04 (rank 0)``, or the dash where no call of the op was timed."""
    if numbers.number(wall_ms) is None or numbers.number(rank) is None:
        return numbers.NA
    return f"{numbers.num(wall_ms)} (rank {int(float(str(rank)))})"


def spread_columns(keys: pd.DataFrame, wall: pd.DataFrame) -> dict[str, pd.Series]:
    """Per row of ``keys`` (op, pg_name as text), the least and the most rank's wall as
    text; the dash where ``wall`` has no spread (a result written before it had one)."""
    if not set(SPREAD) <= set(wall.columns):
        blank = pd.Series([numbers.NA] * len(keys), index=keys.index, dtype=object)
        return {WALL_MOST: blank, WALL_LEAST: blank.copy()}
    of_op = wall[["op", "pg_name", *SPREAD]].copy()
    of_op[["op", "pg_name"]] = of_op[["op", "pg_name"]].astype(str)
    of_op = of_op.drop_duplicates(["op", "pg_name"])
    merged = keys.merge(of_op, on=["op", "pg_name"], how="left")
    least = [
        rank_wall_text(w, r) for w, r in zip(merged[SPREAD[0]], merged[SPREAD[1]], strict=True)
    ]
    most = [rank_wall_text(w, r) for w, r in zip(merged[SPREAD[2]], merged[SPREAD[3]], strict=True)]
    # the most first: the waiting ranks' wall, the story of a straggler job, is in view
    # where a narrow window scrolls the table's last columns
    return {
        WALL_MOST: pd.Series(most, index=keys.index, dtype=object),
        WALL_LEAST: pd.Series(least, index=keys.index, dtype=object),
    }
