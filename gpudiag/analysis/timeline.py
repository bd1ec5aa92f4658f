"""The per-rank timeline drawn by the report and the dashboard: merged intervals per
lane (compute, communication, data loading, other, idle, steps): the intervals the
per-rank table sums (breakdown.timeline_lanes), downsampled to a drawable count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

TIMELINE_COLUMNS = ("rank", "lane", "start_ms", "end_ms", "name")
LANES = ("compute", "communication", "data_loading", "other", "idle")


def timeline(traces: list[Any], rank: int | None = None, max_intervals: int = 5000) -> pd.DataFrame:
    """Merged intervals per rank and lane (ms since the earliest event), for plotting."""
    traces = [t for t in traces if rank is None or t.meta.rank == rank]
    frames = [rank_timeline(t) for t in traces]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    out = pd.concat(frames, ignore_index=True)
    origin = out["start_ns"].min()
    out["start_ms"] = (out["start_ns"] - origin) / 1e6
    out["end_ms"] = (out["end_ns"] - origin) / 1e6
    out = _downsample(out, max_intervals)
    return out[list(TIMELINE_COLUMNS)].reset_index(drop=True)


def rank_timeline(trace: Any) -> pd.DataFrame:
    """One rank's lanes, from breakdown.timeline_lanes (the intervals the per-rank table
    sums), with each collective as its own named interval on the communication lane.
    Cached on the trace (without the rank, which is final only once all are loaded)."""
    out = trace.cached("timeline", lambda: _lanes_frame(trace))
    if out.empty:
        return out
    out = out.copy()
    out.insert(0, "rank", int(trace.meta.rank))
    return out


def _lanes_frame(trace: Any) -> pd.DataFrame:
    from gpudiag.analysis import breakdown as bd

    ev = trace.events
    if ev is None or ev.empty:
        return pd.DataFrame()
    parts = []
    for lane, (s, e) in bd.timeline_lanes(trace).items():
        if lane == "communication":
            comm = ev[bd.comm_event_mask(ev)]
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
