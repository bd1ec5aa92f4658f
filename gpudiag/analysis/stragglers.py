"""Stragglers: the rank(s) that arrive last at collectives, so that everyone else waits.

The k-th collective of a process group is matched across ranks (by sequence number when
every row of the group has one, else by order within the group). A rank's arrival is
when its collective starts (GPU: the comm kernel starts on the stream; gloo: the
``c10d::`` op is called). For each matched collective:

* ``skew_ms`` = this rank's arrival - the earliest arrival;
* ``wait_ms`` = the last arrival - this rank's arrival (time it waits for the others);
* ``lead_ms`` (last arriver only) = last arrival - second-to-last arrival: how much later
  than everyone else it came, i.e. the time all others waited for it alone.

A rank's ``cost_ms_per_step`` is the length of its lead intervals ([second-to-last
arrival, its arrival]) divided by the steps analysed; lead intervals that overlap (DDP
buckets the others issued back to back, computing in between) are one wait, from the
others' arrival at the chain's last call. ``wait_ms_per_step`` is the union of its wait
intervals, overlapped or not.

A rank is named a straggler only when it is late *consistently* over every step the run
recorded (the run's collectives table covers them all, the trace only its window):

* the others wait for it more than it waits for them (its per-step lead cost exceeds
  the median of the other ranks') in at least ``MIN_LAST_SHARE`` of the steps
  (``last_share``);
* the per-step median of its lead is at least the noise floor ``noise_ms``, measured from
  the run itself: ``NOISE_K`` standard errors of the median of that per-step excess
  (1.2533 x 1.4826 x MAD / sqrt(steps): how much its lateness moves from step to step,
  so a loaded host that makes every arrival jitter needs more evidence), and never
  below ``max(0.5 ms, 5 % of the median step)``;
* its mean cost is at least half the largest and twice that of every rank not so named;
* at least ``MIN_STEPS`` steps were matched (``consistent`` is False otherwise: the
  finding is then capped at low severity).

When every rank qualifies, none is named (ranks late in turn are noise).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from gpudiag.analysis import intervals as iv
from gpudiag.analysis.exact import compensated_means
from gpudiag.analysis.matching import Prepare, Table, concat_pieces, match_groups, rank_blocks
from gpudiag.analysis.spill import SpilledTable, SpillFile

# The collective table's columns arrival_skew reads; stragglers reads STRAGGLER_READS of
# its result (pipeline.analyze reads only these back from disk)
ARRIVAL_READS = ("pg_name", "seq", "index", "op", "rank", "start_ns", "step")
STRAGGLER_READS = ("rank", "step", "arrival_ns", "skew_ms", "wait_ms", "is_last", "lead_ms")
SKEW_COLUMNS = (
    "pg_name",
    "seq",
    "index",
    "key",
    "op",
    "rank",
    "arrival_ns",
    "arrival_ms",
    "skew_ms",
    "wait_ms",
    "is_last",
    "lead_ms",
    "step",
)
STRAGGLER_COLUMNS = (
    "rank",
    "collectives",
    "mean_skew_ms",
    "last_count",
    "wait_ms_per_step",
    "cost_ms_per_step",
    "median_cost_ms",
    "steps",
    "last_share",
    "noise_ms",
    "consistent",
    "is_straggler",
)

MIN_COST_MS = 0.5
MIN_COST_FRACTION_OF_STEP = 0.05
MIN_LAST_SHARE = 0.75
NOISE_K = 3.0
MIN_STEPS = 5


def arrival_skew(table: pd.DataFrame) -> pd.DataFrame:
    skew = concat_pieces(arrival_skew_pieces(table))
    return skew if skew is not None else no_skew()


def arrival_skew_pieces(
    table: Table, spill: SpillFile | None = None, prepare: Prepare | None = None
) -> Iterator[pd.DataFrame]:
    """:func:`arrival_skew` of ``prepare`` of each piece of ``table`` (matching.
    match_groups: a table on disk is matched through ``spill``), a few whole matched
    groups at a time, in its order: ``pd.concat`` of the non-empty pieces is the skew
    (none: no skew), so a caller may keep each piece elsewhere (pipeline.analyze spills
    them) as it comes."""
    if table is None or len(table) == 0 or not _two_ranks(table, prepare):
        return
    for piece in match_groups(table, ARRIVAL_READS, spill, prepare=prepare):
        skew = _group_skew(piece)
        if len(skew):
            yield skew


def _two_ranks(table: Table, prepare: Prepare | None) -> bool:
    """Whether the (prepared) rows come from two ranks or more, one piece at a time."""
    kept = SpilledTable.of_table(table)
    seen: set[object] = set()
    for piece in kept.pieces(ARRIVAL_READS):
        seen.update((prepare(piece) if prepare else piece)["rank"].unique())
        if len(seen) >= 2:
            return True
    return False


def no_skew() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in SKEW_COLUMNS})


def _group_skew(t: pd.DataFrame) -> pd.DataFrame:
    """arrival_skew of whole match groups (matching.match_groups' pieces)."""
    t = t.drop_duplicates(["pg_name", "key", "rank"])
    groups = t.groupby(["pg_name", "key"], sort=False)["start_ns"]
    size = groups.transform("size")
    t = t[size.to_numpy() >= 2].copy()
    if t.empty:
        return t
    t["group"] = t.groupby(["pg_name", "key"], sort=False).ngroup()
    t = t.sort_values(["group", "start_ns", "rank"], kind="stable", ignore_index=True)
    group = t["group"].to_numpy()
    start = t["start_ns"].to_numpy(dtype=np.int64)
    last_row = np.append(np.flatnonzero(np.diff(group)), len(t) - 1)  # per group, sorted
    first_row = np.insert(last_row[:-1] + 1, 0, 0)
    slot = np.searchsorted(last_row, np.arange(len(t)))  # the group's position
    first, last, second_last = (
        start[first_row][slot],
        start[last_row][slot],
        start[last_row - 1][slot],
    )
    t["arrival_ns"] = start
    t["arrival_ms"] = (start - first) / 1e6
    t["skew_ms"] = t["arrival_ms"]
    t["wait_ms"] = (last - start) / 1e6
    is_last = np.zeros(len(t), dtype=bool)
    is_last[last_row] = True  # ties: the highest rank among equal arrivals
    t["is_last"] = is_last
    t["lead_ms"] = np.where(is_last, (last - second_last) / 1e6, 0.0)
    t["step"] = t["step"].fillna(-1).astype(np.int64)
    return t.sort_values(["pg_name", "key", "rank"], ignore_index=True)[list(SKEW_COLUMNS)]


def _steps_analysed(skew_steps: np.ndarray, steps: pd.DataFrame | None) -> tuple[int, float]:
    """(number of steps, median step ms) from a steps or breakdown frame (else the
    skew's distinct ``skew_steps``)."""
    n = 0
    median_ms = float("nan")
    if steps is not None and len(steps):
        per_rank = steps.groupby("rank")["step"].nunique() if "rank" in steps else None
        n = (
            int(per_rank.max())
            if per_rank is not None and len(per_rank)
            else steps["step"].nunique()
        )
        if "step_ms" in steps:
            median_ms = float(steps["step_ms"].median())
        elif {"start_ns", "end_ns"} <= set(steps.columns):
            median_ms = float(((steps["end_ns"] - steps["start_ns"]) / 1e6).median())
    if n == 0:
        n = int((skew_steps >= 0).sum()) or 1
    return max(n, 1), median_ms


def _lead_and_wait_spans(
    skew: pd.DataFrame,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lead start, lead end, wait start, wait end) in ns per row: the others wait for
    the last rank from the second-to-last arrival on; every rank waits from its own
    arrival to the last."""
    arrival = skew["arrival_ns"].to_numpy(dtype=np.int64)
    lead = np.rint(skew["lead_ms"].to_numpy(dtype=float) * 1e6).astype(np.int64)
    wait = np.rint(skew["wait_ms"].to_numpy(dtype=float) * 1e6).astype(np.int64)
    return arrival - lead, arrival, arrival, arrival + wait


def _union_ms_by(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Union length (ms) per group: waits for collectives issued back to back (DDP
    buckets) overlap and must not be counted twice."""
    return iv.grouped_union_length(codes, starts, ends) / 1e6


def _lead_ms_by(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The others' wait for a last rank, per group (ms). Leads that overlap are calls the
    others issued one after another without blocking (DDP's bucket all-reduces, called
    from backward as each bucket fills): they computed until their last call of the
    chain, so the chain costs them from that call to the last rank's arrival, not from
    their first call (gloo DDP, 4 buckets, a rank sleeping 40 ms: the union was 25 % over
    the step the fix gave back, this 7 %; bench/straggler_cost.py)."""
    return iv.grouped_chain_tail_length(codes, starts, ends) / 1e6


def _per_step_cost(skew: pd.DataFrame, ranks: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(rank x step) matrix of lead ms; steps where a rank was never last are 0."""
    lead_s, lead_e, _, _ = _lead_and_wait_spans(skew)
    r = np.searchsorted(ranks, skew["rank"].to_numpy())
    k = np.searchsorted(steps, skew["step"].to_numpy())
    cost = _lead_ms_by(r * len(steps) + k, lead_s, lead_e)
    cost = np.concatenate([cost, np.zeros(len(ranks) * len(steps) - len(cost))])
    return cost.reshape(len(ranks), len(steps))


def _per_step_lag(per_step: np.ndarray) -> np.ndarray:
    """(rank x step) the rank's lead cost in the step minus the median of the other
    ranks' (ms): positive when the others waited for it more than it waited for them."""
    n = per_step.shape[0]
    if n < 2:
        return np.zeros_like(per_step)
    return per_step - _median_of_others(per_step)


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """(rank x step) the median over the other ranks (rows) of each column, exactly as
    ``np.median(np.delete(values, i, axis=0), axis=0)`` for each row i, from one sort per
    column (that was n medians of n-1 rows: ranks x ranks)."""
    n = values.shape[0]
    if np.isnan(values).any():  # np.median's NaN rules: the plain way
        return np.stack([np.median(np.delete(values, i, axis=0), axis=0) for i in range(n)])
    order = np.argsort(values, axis=0, kind="stable")
    ordered = np.take_along_axis(values, order, axis=0)
    position = np.empty_like(order)  # each row's place in its column's order
    np.put_along_axis(position, order, np.arange(n)[:, None], axis=0)
    m = n - 1  # without the row itself, the j-th of the rest is ordered[j + (j >= place)]

    def rest(j: int) -> np.ndarray:
        at = j + (j >= position)
        return np.take_along_axis(ordered, at, axis=0)

    if m % 2:
        return rest(m // 2)
    low, high = rest(m // 2 - 1), rest(m // 2)
    return (low + high) / 2.0


def _distinct_steps(skew: Table) -> np.ndarray:
    """The skew's steps, sorted, one piece at a time."""
    kept = SpilledTable.of_table(skew)
    seen = [np.unique(piece["step"].to_numpy()) for piece in kept.pieces(["step"])]
    return np.unique(np.concatenate(seen)) if seen else np.empty(0, dtype=np.int64)


def _rank_block_costs(
    skew: pd.DataFrame, n_steps: int, steps_seen: np.ndarray
) -> tuple[pd.DataFrame, np.ndarray]:
    """Per rank of a block of whole ranks' skew rows: its calls, mean skew, times last,
    wait and cost per step; and its (rank x step) lead cost."""
    ranks = np.unique(skew["rank"].to_numpy())
    r = np.searchsorted(ranks, skew["rank"].to_numpy())
    lead_s, lead_e, wait_s, wait_e = _lead_and_wait_spans(skew)
    g = skew.groupby("rank")
    out = pd.DataFrame(
        {
            "collectives": g.size(),
            "mean_skew_ms": compensated_means(r, skew["skew_ms"].to_numpy(float), len(ranks)),
            "last_count": g["is_last"].sum(),
            "wait_ms_per_step": _pad(_union_ms_by(r, wait_s, wait_e), len(ranks)) / n_steps,
            "cost_ms_per_step": _pad(_lead_ms_by(r, lead_s, lead_e), len(ranks)) / n_steps,
        },
        index=pd.Index(ranks, name="rank"),
    )
    return out, _per_step_cost(skew, ranks, steps_seen)


def _pad(values: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([values, np.zeros(size - len(values))])


def stragglers(
    skew: Table, steps: pd.DataFrame | None = None, spill: SpillFile | None = None
) -> pd.DataFrame:
    """Per rank: how often and by how much it arrives last, and what that costs the
    others per step. ``is_straggler`` uses the per-step median of the cost, so one
    hiccup (a page fault, a noisy neighbour) does not name a rank. A skew kept on disk
    is read a block of whole ranks at a time (matching.rank_blocks, through ``spill``)."""
    if skew is None or len(skew) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in STRAGGLER_COLUMNS})
    steps_seen = _distinct_steps(skew)
    n_steps, median_step_ms = _steps_analysed(steps_seen, steps)
    blocks = [
        _rank_block_costs(block, n_steps, steps_seen)
        for block in rank_blocks(skew, STRAGGLER_READS, spill)
    ]
    out = pd.concat([b[0] for b in blocks]) if len(blocks) > 1 else blocks[0][0]
    ranks = out.index.to_numpy()
    per_step = np.vstack([b[1] for b in blocks])
    missing_steps = max(n_steps - per_step.shape[1], 0)
    if missing_steps:
        per_step = np.hstack([per_step, np.zeros((len(ranks), missing_steps))])
    out["median_cost_ms"] = np.median(per_step, axis=1)
    lag = _per_step_lag(per_step[:, : len(steps_seen)])
    n_seen = lag.shape[1]
    out["steps"] = n_seen
    out["last_share"] = (lag > 0).sum(axis=1) / max(n_seen, 1)
    med = np.median(lag, axis=1) if n_seen else np.zeros(len(ranks))
    mad = np.median(np.abs(lag - med[:, None]), axis=1) if n_seen else np.zeros(len(ranks))
    # standard error of a median: 1.2533 sigma / sqrt(n), sigma = 1.4826 MAD
    out["noise_ms"] = NOISE_K * 1.2533 * 1.4826 * mad / np.sqrt(max(n_seen, 1))
    out["consistent"] = n_seen >= MIN_STEPS
    out = out.reset_index()
    threshold = MIN_COST_MS
    if median_step_ms == median_step_ms:  # not NaN
        threshold = max(threshold, MIN_COST_FRACTION_OF_STEP * median_step_ms)
    floor = np.maximum(out["noise_ms"].to_numpy(), threshold)
    cost = out["cost_ms_per_step"]
    candidate = (
        (out["median_cost_ms"] >= floor)
        & (out["last_share"] >= MIN_LAST_SHARE)
        & (cost >= 0.5 * cost.max())
    )
    rest = cost[~candidate].max() if (~candidate).any() else float("nan")
    # everyone late in turn is noise; a straggler stands out from the rest
    out["is_straggler"] = candidate & (~candidate).any() & (cost >= 2 * rest)
    return out.sort_values("cost_ms_per_step", ascending=False, ignore_index=True)[
        list(STRAGGLER_COLUMNS)
    ]
