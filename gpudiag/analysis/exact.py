"""Statistics of float columns that do not depend on how the table is cut: by group,
whatever else is in the table; or of a column read a piece at a time (a many-rank
run's calls on disk), exactly as of the whole column.

pandas' groupby sum and mean add a group's values with Kahan's compensation in row order
where the groups are interleaved, but with ``np.add.reduceat`` (pairwise) where the rows
come sorted by group (pandas >= 3). An analysis that reads a many-rank run a block of
groups at a time (matching.key_blocks) would then get other last digits than the same
analysis of the whole table. These sums are always the compensated one, in row order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

# The 64 bits of a float64's sort key are narrowed 16 at a time (streamed_median)
_DIGIT_BITS = 16


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


def streamed_median(pieces: Callable[[], Iterable[np.ndarray]], held: int) -> float:
    """The median of the non-NaN values of the pieces, as pandas' groupby median makes
    it (the middle one, or the mean of the two middle ones; NaN when there is none),
    holding about ``held`` values at once: a radix selection on the values' sort keys,
    each pass reading the pieces again (``pieces()`` gives them anew each time)."""
    n = sum(int(np.count_nonzero(~np.isnan(piece))) for piece in pieces())
    if n == 0:
        return float("nan")
    upper = _kth(pieces, n // 2, held)
    if n % 2:
        return upper
    return (upper + _kth(pieces, n // 2 - 1, held)) / 2


def _sort_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the floats' order (NaN left out)."""
    bits = values[~np.isnan(values)].astype(np.float64).view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))


def _value_of(key: np.uint64) -> float:
    bits = np.uint64(key) ^ np.uint64(1 << 63) if key >> np.uint64(63) else ~np.uint64(key)
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def _kth(pieces: Callable[[], Iterable[np.ndarray]], k: int, held: int) -> float:
    """The k-th smallest (0-based) non-NaN value of the pieces."""
    prefix, known = np.uint64(0), 0  # the top ``known`` bits of the key are prefix's
    while known < 64:
        shift = np.uint64(64 - known - _DIGIT_BITS)
        counts = np.zeros(1 << _DIGIT_BITS, dtype=np.int64)
        for piece in pieces():
            keys = _matching(_sort_keys(piece), prefix, known)
            counts += np.bincount((keys >> shift).astype(np.int64) & 0xFFFF, minlength=len(counts))
        below = np.cumsum(counts)
        digit = int(np.searchsorted(below, k, side="right"))
        k -= int(below[digit - 1]) if digit else 0
        prefix |= np.uint64(digit) << shift
        known += _DIGIT_BITS
        if counts[digit] <= held or known == 64:
            break
    if known == 64:
        return _value_of(prefix)
    keys = np.concatenate([_matching(_sort_keys(p), prefix, known) for p in pieces()])
    return _value_of(np.partition(keys, k)[k])


def _matching(keys: np.ndarray, prefix: np.uint64, known: int) -> np.ndarray:
    """The keys whose top ``known`` bits are ``prefix``'s."""
    if not known:
        return keys
    shift = np.uint64(64 - known)
    return keys[(keys >> shift) == (prefix >> shift)]
