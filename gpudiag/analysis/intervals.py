"""Vectorised interval algebra on integer nanosecond intervals.

An interval set is a pair of int64 arrays ``(starts, ends)``, sorted, disjoint and
non-empty after :func:`union`. Every operation is a sweep over sorted end points with
numpy (cumulative sums), never a Python loop over intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpudiag.analysis.spill import Blob, as_bytes

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def empty() -> Intervals:
    return (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping intervals into a sorted disjoint set."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return empty()
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return starts[first], np.maximum.reduceat(ends, first)


def length(a: Intervals) -> int:
    return int((a[1] - a[0]).sum())


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    s = np.clip(a[0], lo, hi)
    e = np.clip(a[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def combine(sets: list[Intervals], keep: Callable[[np.ndarray], np.ndarray]) -> Intervals:
    """Sweep over several disjoint sets at once. ``keep`` receives a (segments, n_sets)
    boolean matrix (is each set active on each elementary segment) and returns the
    segments to keep; the result is merged."""
    points = []
    deltas = []
    for i, (s, e) in enumerate(sets):
        d = np.zeros((len(s) * 2, len(sets)), dtype=np.int8)  # +1 / -1: 1 byte each
        d[: len(s), i] = 1
        d[len(s) :, i] = -1
        points.append(np.concatenate([s, e]))
        deltas.append(d)
    if not points or sum(len(p) for p in points) == 0:
        return empty()
    pts = np.concatenate(points)
    delta = np.concatenate(deltas)
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    # counts per set, at most the set's interval count: int32 (not int64) is exact
    active = np.cumsum(delta[order], axis=0, dtype=np.int32)[:-1] > 0
    seg_start, seg_end = pts[:-1], pts[1:]
    selected = keep(active) & (seg_end > seg_start)
    return union(seg_start[selected], seg_end[selected])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return combine([a, b], lambda m: m[:, 0] & m[:, 1])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    return combine([a, b], lambda m: m[:, 0] & ~m[:, 1])


def merge(*sets: Intervals) -> Intervals:
    if not sets:
        return empty()
    return union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def per_window_length(a: Intervals, win_starts: np.ndarray, win_ends: np.ndarray) -> np.ndarray:
    """Length of ``a`` inside each window (windows may be unsorted, must not matter):
    prefix sums of covered time evaluated at window edges."""
    s, e = a
    win_starts = np.asarray(win_starts, dtype=np.int64)
    win_ends = np.asarray(win_ends, dtype=np.int64)
    if len(s) == 0:
        return np.zeros(len(win_starts), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])
    return _covered_until(s, e, cum, win_ends) - _covered_until(s, e, cum, win_starts)


def _covered_until(s: np.ndarray, e: np.ndarray, cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered time of the disjoint set (s, e) before each instant t."""
    i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    full = cum[np.maximum(i - 1, 0)]
    last = np.maximum(i - 1, 0)
    partial = np.clip(t - s[last], 0, e[last] - s[last])
    return np.where(i > 0, full + partial, 0)


def _grouped_intervals(
    groups: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int64 groups, starts and ends no earlier than the starts, and a zero total per
    group (coded 0..G-1)."""
    groups = np.asarray(groups, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.maximum(np.asarray(ends, dtype=np.int64), starts)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    return groups, starts, ends, np.zeros(n_groups, dtype=np.int64)


def grouped_union_length(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Length of the union of the intervals of each group (groups coded 0..G-1), in one
    sweep: groups are laid side by side on one axis so they cannot touch."""
    groups, starts, ends, out = _grouped_intervals(groups, starts, ends)
    if len(groups) == 0:
        return out
    origin = starts.min()
    span = int(ends.max() - origin) + 1
    if span * len(out) >= 2**62:  # too wide to lay side by side: one group at a time
        for g in range(len(out)):
            m = groups == g
            out[g] = length(union(starts[m], ends[m]))
        return out
    shift = groups * span - origin
    s, e = union(starts + shift, ends + shift)
    np.add.at(out, s // span, e - s)
    return out


def grouped_chain_tail_length(
    groups: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Per group (coded 0..G-1): intervals that overlap form a chain, and each chain
    counts only from the start of the interval that ends it (the latest start among
    those ending last) to its end. Intervals that only touch are separate chains."""
    groups, starts, ends, out = _grouped_intervals(groups, starts, ends)
    if len(groups) == 0:
        return out
    order = np.lexsort((starts, groups))
    g, s, e = groups[order], starts[order], ends[order]
    reach = _grouped_running_max(g, e)
    new_chain = np.r_[True, (g[1:] != g[:-1]) | (s[1:] >= reach[:-1])]
    chain = np.cumsum(new_chain) - 1
    last = np.lexsort((s, e, chain))  # within a chain: by end, then by start
    is_last = np.r_[chain[last][1:] != chain[last][:-1], True]
    tail = last[is_last]
    np.add.at(out, g[tail], e[tail] - s[tail])
    return out


def _grouped_running_max(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` that restarts where ``groups`` (sorted) changes."""
    if len(values) == 0:
        return values
    lowest = values.min()
    # lift each group above every earlier one, so one accumulate never carries over
    rank = np.cumsum(np.r_[False, groups[1:] != groups[:-1]])
    width = int(values.max() - lowest) + 1
    if width * (int(rank[-1]) + 1) < 2**62:
        offset = rank * width - lowest
        return np.maximum.accumulate(values + offset) - offset
    out = values.copy()
    for start, stop in _runs(rank):
        out[start:stop] = np.maximum.accumulate(values[start:stop])
    return out


def _runs(codes: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1], True])
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=False)]


def pack_ints(*arrays: np.ndarray) -> bytes:
    """Integer arrays as one compact, lossless blob (what a per-rank result carries back
    from a worker): int64 deltas, byte-shuffled (all low bytes, then the next...) and
    zlib-compressed. Sorted time stamps take 3-4 bytes each instead of 8."""
    import zlib

    parts = [np.asarray(a, dtype=np.int64) for a in arrays]
    flat = np.concatenate([*parts, np.empty(0, dtype=np.int64)])
    deltas = np.diff(flat, prepend=np.int64(0))
    shuffled = deltas.view(np.uint8).reshape(-1, 8).T.tobytes()
    header = np.array([len(p) for p in parts], dtype=np.int64).tobytes()
    return np.int64(len(parts)).tobytes() + header + zlib.compress(shuffled, 6)


def unpack_ints(blob: bytes) -> list[np.ndarray]:
    """The arrays given to :func:`pack_ints`, exactly."""
    import zlib

    n = int(np.frombuffer(blob[:8], dtype=np.int64)[0])
    sizes = np.frombuffer(blob[8 : 8 + 8 * n], dtype=np.int64)
    raw = np.frombuffer(zlib.decompress(blob[8 + 8 * n :]), dtype=np.uint8)
    flat = np.cumsum(raw.reshape(8, -1).T.copy().view(np.int64).ravel())
    return np.split(flat, np.cumsum(sizes)[:-1]) if n else []


class PackedSets:
    """Named interval sets stored packed (:func:`pack_ints`); ``sets[name]`` unpacks one.
    Where they were computed (the per-rank task, which reads them several times) the
    arrays are also kept as they are; once pickled (on the client, which reads one set
    once per rank) only the packed form is kept."""

    def __init__(self, sets: dict[str, Intervals]) -> None:
        self.names = tuple(sets)
        self.blob: Blob = pack_ints(*(a for name in self.names for a in sets[name]))
        self._open: dict[str, Intervals] = dict(sets)

    def __getitem__(self, name: str) -> Intervals:
        if name in self._open:
            return self._open[name]
        arrays = unpack_ints(as_bytes(self.blob))
        i = self.names.index(name)
        return (arrays[2 * i], arrays[2 * i + 1])

    def several(self, names: Sequence[str]) -> list[Intervals]:
        """``[self[name] for name in names]``, the blob unpacked once."""
        if all(name in self._open for name in names):
            return [self._open[name] for name in names]
        arrays = unpack_ints(as_bytes(self.blob))
        at = [self.names.index(name) for name in names]
        return [(arrays[2 * i], arrays[2 * i + 1]) for i in at]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def keys(self) -> tuple[str, ...]:
        return self.names

    def __getstate__(self) -> dict[str, object]:
        # a spilled blob pickles as its bytes (SpilledBytes.__reduce__), except into the
        # fold's own spill file, which keeps the reference (fold._FoldPickler)
        return {"names": self.names, "blob": self.blob}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.names = state["names"]  # type: ignore[assignment]
        self.blob = state["blob"]  # type: ignore[assignment]
        self._open = {}
