"""How many times per optimizer step DDP all-reduces the gradients.

DDP all-reduces every bucket once per backward pass unless the backward runs under
``model.no_sync()`` (``accelerator.accumulate()``, Lightning's and the HF Trainer's
accumulation use it). A loop that accumulates gradients over K micro-batches without it
all-reduces them K times per optimizer step where once would do: the first K-1 rounds are
thrown away by the next backward's sum.

Evidence, per rank and DDP model: the bucket sizes DDP logged (``ddp_stats``'s
``rebuilt_bucket_sizes``, bytes) and the Flight Recorder's all-reduce calls per optimizer
step (``collectives``: ``op``, ``in_bytes``, ``step``). A round is one all-reduce of every
bucket: the rounds of a step are the fewest calls of any one bucket size (divided by how
many buckets have that size). The first step (DDP rebuilds its buckets there) and the last
(it may be cut short) are left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# DDP's default cap of the first bucket it reduces (reducer's first_bucket_bytes)
FIRST_BUCKET_BYTES = 2**20
# at least this many steps must show the same rounds for a verdict
MIN_STEPS = 3
# and this share of the steps analysed
MIN_AGREEMENT = 0.8


@dataclass(frozen=True)
class GradientSyncRounds:
    """DDP's gradient all-reduce rounds per optimizer step (median over the steps)."""

    rounds_per_step: int
    buckets: int
    steps: int  # steps analysed (per rank, the fewest)
    ranks: list[int] = field(default_factory=list)


def _bucket_sizes(ddp_stats: pd.DataFrame, rank: int) -> list[tuple[int, ...]]:
    """Each DDP model's bucket sizes on ``rank`` (bytes; the latest logged row)."""
    rows = ddp_stats[ddp_stats["rank"] == rank]
    if "rebuilt_bucket_sizes" not in rows:
        return []
    models = rows["model"] if "model" in rows else pd.Series(0, index=rows.index)
    sizes = []
    for _, model_rows in rows.groupby(models):
        last = model_rows.sort_values("step")["rebuilt_bucket_sizes"].iloc[-1]
        if (
            isinstance(last, list | tuple)
            and last
            and all(isinstance(b, int | float) and b > 0 for b in last)
        ):
            sizes.append(tuple(int(b) for b in last))
    return sizes


def _rounds_by_step(calls: pd.DataFrame, sizes: tuple[int, ...]) -> pd.Series:
    """Rounds of one model's buckets in each step of one rank's all-reduce calls."""
    multiplicity = Counter(sizes)
    per_size = calls[calls["in_bytes"].isin(multiplicity)].groupby(["step", "in_bytes"]).size()
    if per_size.empty:
        return pd.Series(dtype=float)
    table = per_size.unstack(fill_value=0)
    for size in multiplicity:
        if size not in table:
            return pd.Series(dtype=float)  # a bucket never all-reduced: not this model's calls
        table[size] = table[size] // multiplicity[size]
    return table[list(multiplicity)].min(axis=1)


def gradient_sync_rounds(
    collectives: pd.DataFrame | None, ddp_stats: pd.DataFrame | None
) -> GradientSyncRounds | None:
    """The rounds per step every rank agrees on, or None without DDP evidence."""
    if collectives is None or ddp_stats is None or not len(collectives) or not len(ddp_stats):
        return None
    needed = {"rank", "step", "op", "in_bytes"}
    if not needed <= set(collectives.columns) or not {"rank", "step"} <= set(ddp_stats.columns):
        return None
    reduces = collectives[collectives["op"] == "all_reduce"].dropna(subset=["step", "in_bytes"])
    verdicts: dict[int, tuple[int, int, int]] = {}
    for rank in sorted(int(r) for r in ddp_stats["rank"].dropna().unique()):
        calls = reduces[reduces["rank"] == rank]
        for sizes in _bucket_sizes(ddp_stats, rank):
            rounds = _rounds_by_step(calls, sizes)
            steps = sorted(rounds.index)
            rounds = rounds.drop(index=steps[:1] + steps[-1:]) if len(steps) > 2 else rounds[:0]
            if len(rounds) < MIN_STEPS:
                continue
            typical = int(np.median(rounds.to_numpy()))
            agree = float((rounds == typical).mean())
            if typical >= 1 and agree >= MIN_AGREEMENT:
                verdicts[rank] = max(
                    verdicts.get(rank, (0, 0, 0)), (typical, len(sizes), len(rounds))
                )
    if not verdicts:
        return None
    rounds_seen = {v[0] for v in verdicts.values()}
    if len(rounds_seen) != 1:
        return None  # the ranks disagree: say nothing
    rounds_per_step = rounds_seen.pop()
    return GradientSyncRounds(
        rounds_per_step=rounds_per_step,
        buckets=max(v[1] for v in verdicts.values()),
        steps=min(v[2] for v in verdicts.values()),
        ranks=sorted(verdicts),
    )


def unsplittable_share(ddp_stats: pd.DataFrame | None) -> float | None:
    """The share of the gradient one parameter holds at least, from the lowest rank's
    bucket sizes and ``bucket_cap_bytes`` (DDP's logging): a bucket closes when it reaches
    the cap, so a bucket larger than the cap holds one tensor of at least the excess, and
    no bucket_cap_mb splits a tensor (probe 29h: a 4.2 MB weight in 4.77 MB of gradient,
    2 buckets at bucket_cap_mb=1). None without that logging."""
    if ddp_stats is None or not len(ddp_stats) or "bucket_cap_bytes" not in ddp_stats:
        return None
    ranks = ddp_stats["rank"].dropna() if "rank" in ddp_stats else pd.Series(dtype=float)
    if ranks.empty:
        return None
    lowest = int(ranks.min())
    caps = pd.to_numeric(
        ddp_stats[ddp_stats["rank"] == lowest]["bucket_cap_bytes"], errors="coerce"
    )
    caps = caps[caps > 0]
    sizes = _bucket_sizes(ddp_stats, lowest)
    if caps.empty or len(sizes) != 1:  # one DDP model's buckets, or say nothing
        return None
    cap = float(caps.max())
    buckets = sizes[0]
    # the first bucket (gradients ready first) closes at 1 MiB (DDP's first_bucket_bytes)
    limits = [min(cap, FIRST_BUCKET_BYTES)] + [cap] * (len(buckets) - 1)
    return max(max(b - limit, 0.0) for b, limit in zip(buckets, limits, strict=True)) / sum(buckets)
