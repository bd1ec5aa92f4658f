"""Sums of float columns that do not depend on how the table is cut: by group, whatever
else is in the table; or of a column read a piece at a time, exactly as of the whole
column (the arrival skew's means, stragglers.py; the collective summary's totals are the
call store's ``fsum``, store.py).

pandas' groupby sum and mean add a group's values with Kahan's compensation in row order
where the groups are interleaved, but with ``np.add.reduceat`` (pairwise) where the rows
come sorted by group (pandas >= 3). An analysis that reads a many-rank run a block of
groups at a time (matching.key_blocks) would then get other last digits than the same
analysis of the whole table. These sums are always the compensated one, in row order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def compensated_sums(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Per group (codes 0..groups-1): the sum of its values, NaN skipped (0.0 when it
    has none), in row order with Kahan's compensation, step for step as pandas'
    group_sum and group_mean make it."""
    ok = ~np.isnan(values)
    codes, values = codes[ok], values[ok]
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=groups)
    ends = np.cumsum(counts)
    ordered = values[order].tolist()
    sums = [streamed_sum([ordered[end - n : end]]) for n, end in zip(counts, ends, strict=True)]
    return np.asarray(sums, dtype=float)


def compensated_means(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Per group: the mean of its values, NaN skipped (NaN when it has none), from
    :func:`compensated_sums`."""
    counts = np.bincount(codes[~np.isnan(values)], minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        return compensated_sums(codes, values, groups) / counts


def streamed_sum(pieces: Iterable[Iterable[float]]) -> float:
    """:func:`compensated_sums` of one group whose values come a piece at a time."""
    total = compensation = 0.0
    for piece in pieces:
        for value in piece:
            if value != value:  # NaN: skipped
                continue
            y = value - compensation
            t = total + y
            compensation = t - total - y
            if compensation != compensation:  # an infinity: no compensation
                compensation = 0.0
            total = t
    return total
