"""The per-rank timeline drawn by the report and the dashboard: merged intervals per
lane (compute, communication, data loading, other, idle, steps): the intervals the
per-rank table sums (breakdown.timeline_lanes), downsampled to a drawable count.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import intervals as iv
from gpudiag.analysis.spill import Blob, as_bytes

TIMELINE_COLUMNS = ("rank", "lane", "start_ms", "end_ms", "name")
LANES = ("compute", "communication", "data_loading", "other", "idle")


def timeline(
    traces: list[Any],
    rank: int | None = None,
    max_intervals: int = 5000,
    ranks: Collection[int] | None = None,
) -> pd.DataFrame:
    """Merged intervals per rank and lane, for plotting, of ``rank``, of ``ranks``, or
    of every rank. Times are ms since the earliest interval of any rank, whichever ranks
    are drawn, so ranks drawn alone or together line up the same."""
    wanted = {rank} if rank is not None else set(ranks) if ranks is not None else None
    origin = min((t for t in map(_first_start, traces) if t is not None), default=None)
    frames = [rank_timeline(t) for t in traces if wanted is None or t.meta.rank in wanted]
    frames = [f for f in frames if not f.empty]
    if not frames or origin is None:
        return pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    out = pd.concat(frames, ignore_index=True)
    out["start_ms"] = (out["start_ns"] - origin) / 1e6
    out["end_ms"] = (out["end_ns"] - origin) / 1e6
    out = _downsample(out, max_intervals)
    return out[list(TIMELINE_COLUMNS)].reset_index(drop=True)


def _first_start(trace: Any) -> int | None:
    """The rank's earliest interval start (ns), read from its packed lanes alone (None
    where its timeline failed: drawn, it raises the failure)."""
    try:
        lanes = _rank_lanes(trace)
    except Exception:  # noqa: BLE001 - the rank is left out of the origin only
        return None
    return lanes.first_start() if lanes is not None else None


# Intervals kept per rank (all lanes together): what a chart can draw. Above it, each
# lane's neighbours are merged (rank_lanes); the per-rank result stays a few kB.
RANK_BUDGET = 2000


@dataclass(slots=True)
class RankLanes:
    """One rank's timeline, compact: a lane and a name code per interval, and the start
    and end times (ns) packed (intervals.pack_ints). What travels back from a worker."""

    lanes: tuple[str, ...]
    names: tuple[str, ...]
    blob: Blob  # lane codes, name codes, starts, ends (fold may spill it to disk)
    merged: bool = False  # neighbours were merged to fit RANK_BUDGET

    @classmethod
    def of(cls, frame: pd.DataFrame, merged: bool = False) -> RankLanes:
        lanes, lane_codes = _codes(frame["lane"])
        names, name_codes = _codes(frame["name"])
        blob = iv.pack_ints(
            lane_codes, name_codes, frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
        )
        return cls(lanes, names, blob, merged)

    def first_start(self) -> int | None:
        starts = iv.unpack_ints(as_bytes(self.blob))[2]
        return int(starts.min()) if len(starts) else None

    def frame(self) -> pd.DataFrame:
        """(lane, start_ns, end_ns, name), one row per interval."""
        lane_codes, name_codes, start, end = iv.unpack_ints(as_bytes(self.blob))
        return pd.DataFrame(
            {
                "lane": np.array(self.lanes, dtype=object)[lane_codes],
                "start_ns": start,
                "end_ns": end,
                "name": np.array(self.names, dtype=object)[name_codes],
            }
        )


def _codes(values: pd.Series) -> tuple[tuple[str, ...], np.ndarray]:
    codes, uniques = pd.factorize(values.astype(str), sort=False)
    return tuple(str(u) for u in uniques), codes.astype(np.int64)


def rank_timeline(trace: Any) -> pd.DataFrame:
    """One rank's lanes, from breakdown.timeline_lanes (the intervals the per-rank table
    sums), with each collective as its own named interval on the communication lane.
    Cached on the trace compact and bounded (:class:`RankLanes`, at most RANK_BUDGET
    intervals besides the steps), without the rank, which is final only once all traces
    are loaded."""
    lanes = _rank_lanes(trace)
    if lanes is None:
        return pd.DataFrame()
    out = lanes.frame()
    out.insert(0, "rank", int(trace.meta.rank))
    return out


def _rank_lanes(trace: Any) -> RankLanes | None:
    lanes = trace.cached("timeline", lambda: rank_lanes(_lanes_frame(trace)))
    return lanes if isinstance(lanes, RankLanes) else None


def rank_lanes(frame: pd.DataFrame, budget: int = RANK_BUDGET) -> RankLanes | None:
    """The lanes, merged until at most ``budget`` intervals remain (steps not counted).
    Merging joins a lane's neighbours closer than a growing tolerance into one interval
    that starts where the first starts and lasts as long as the union of the joined
    ones, so each lane's busy (and idle) total stays exact to the nanosecond."""
    if frame.empty:
        return None
    steps = frame[frame["lane"] == "step"]
    rest = frame[frame["lane"] != "step"]
    if len(rest) <= budget:
        return RankLanes.of(frame)
    tol = 1000  # ns
    while True:
        merged = [_merge_lane(lane, g, tol) for lane, g in rest.groupby("lane", sort=False)]
        out = pd.concat(merged, ignore_index=True)
        if len(out) <= budget or tol > 10**15:
            return RankLanes.of(pd.concat([out, steps], ignore_index=True), merged=True)
        tol *= 2


def _merge_lane(lane: str, g: pd.DataFrame, tol: int) -> pd.DataFrame:
    """One lane's intervals joined where closer than ``tol`` ns (see rank_lanes); an
    interval left alone keeps its name."""
    s, e = iv.union(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
    new = np.concatenate([[True], s[1:] > e[:-1] + tol])
    first = np.flatnonzero(new)
    busy = np.add.reduceat(e - s, first)
    alone = np.diff(np.append(first, len(s))) == 1
    names = np.full(len(first), lane, dtype=object)
    if alone.any():  # a lone union interval that is exactly one original keeps its name
        key = pd.DataFrame({"s": g["start_ns"].to_numpy(), "e": g["end_ns"].to_numpy()})
        key["name"] = g["name"].to_numpy()
        key = key.drop_duplicates(["s", "e"]).set_index(["s", "e"])["name"]
        idx = pd.MultiIndex.from_arrays([s[first][alone], e[first][alone]])
        names[alone] = key.reindex(idx).fillna(lane).to_numpy()
    return pd.DataFrame(
        {"lane": lane, "start_ns": s[first], "end_ns": s[first] + busy, "name": names}
    )


def _lanes_frame(trace: Any) -> pd.DataFrame:
    from gpudiag.analysis import breakdown as bd
    from gpudiag.analysis.trace_model import with_comm

    ev = trace.events
    if ev is None or ev.empty:
        return pd.DataFrame()
    parts = []
    for lane, (s, e) in bd.timeline_lanes(trace).items():
        if lane == "communication":
            comm = with_comm(ev[bd.comm_event_mask(ev)], trace.comm)
            if len(comm):
                parts.append(_collective_rows(comm))
        elif len(s):
            parts.append(pd.DataFrame({"lane": lane, "start_ns": s, "end_ns": e, "name": lane}))
    steps = trace.steps
    if steps is not None and len(steps):
        parts.append(
            pd.DataFrame(
                {
                    "lane": "step",
                    "start_ns": steps["start_ns"].to_numpy(),
                    "end_ns": steps["end_ns"].to_numpy(),
                    "name": [f"step {int(n)}" for n in steps["step"]],
                }
            )
        )
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True)


def _collective_rows(comm: pd.DataFrame) -> pd.DataFrame:
    """Each collective as its own interval, named by its op, so it can be highlighted;
    _downsample merges them (losing the names) only when there are too many to draw."""
    op = comm["comm_op"].astype("string").fillna("").astype(str)
    names = op.where(op != "", comm["name"].astype(str))
    return pd.DataFrame(
        {
            "lane": "communication",
            "start_ns": comm["start_ns"].to_numpy(),
            "end_ns": comm["end_ns"].to_numpy(),
            "name": names.to_numpy(),
        }
    )


def _downsample(frame: pd.DataFrame, max_intervals: int) -> pd.DataFrame:
    """Merge neighbours closer than a growing tolerance until few enough intervals remain."""
    if len(frame) <= max_intervals:
        return frame
    tol = 0.001
    while True:
        merged = []
        for (rank, lane), g in frame.groupby(["rank", "lane"], sort=False):
            g = g.sort_values("start_ms")
            start = g["start_ms"].to_numpy()
            end = np.maximum.accumulate(g["end_ms"].to_numpy())
            new = np.concatenate([[True], start[1:] > end[:-1] + tol])
            group = np.cumsum(new) - 1
            ends = np.zeros(group[-1] + 1)
            np.maximum.at(ends, group, end)
            merged.append(
                pd.DataFrame(
                    {
                        "rank": rank,
                        "lane": lane,
                        "start_ms": start[new],
                        "end_ms": ends,
                        "name": lane,
                    }
                )
            )
        out = pd.concat(merged, ignore_index=True)
        if len(out) <= max_intervals or tol > 1e6:
            return out
        tol *= 4
