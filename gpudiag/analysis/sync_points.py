"""Small collectives that are synchronisation points, not gradient transfer.

A framework (or the user) issues small collectives of its own each step: Lightning
broadcasts an 8-byte SIGTERM flag every step and, for ``self.log(..., sync_dist=True)``,
runs a barrier and an all_reduce of the metric; the HF Trainer gathers a count. Their
payload is a few bytes: their time is the ranks' wait for the slowest to arrive and the
call's latency (on a CPU host, gloo's thread being scheduled), not bytes moving. Bucket
size, overlap, no_sync or compression cannot give it back, so the exposed time inside
them is not costed as the gradient sync's transfer (findings.exposed_split sets it
apart) and each call site is reported on its own (:func:`sync_point_findings`).

Which calls: those a gpudiag run timed through the Python API (source ``run:dist``: a
framework's or the user's ``torch.distributed`` call; DDP's C++ bucket all-reduces never
go through it) of at most :data:`SYNC_POINT_BYTES`, inside a step, with an end time; in
a trace without a run's table, a broadcast, all_gather or barrier that small (an
all_reduce that small may be a tiny model's gradient bucket). Each call is matched
across the ranks of its group (sequence number, else order); its span splits at the last
rank's arrival: before, the wait for late peers (comms.peer_wait counts it already);
after, its latency, which this module adds. A call not seen on every rank is left out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import intervals as iv
from gpudiag.analysis.findings import (
    STARVED_HOST_WORDS,
    Finding,
    host_starved,
    ms,
    severity_for,
    severity_under_load,
)
from gpudiag.analysis.matching import Table
from gpudiag.numfmt import ms_text, pct_text

# A collective this small carries a flag or a few metrics: its time is synchronisation.
SYNC_POINT_BYTES = 1024
# A call site must recur in this many steps to be a per-step synchronisation point
MIN_STEPS = 3
# Ops a trace's small call is taken as a sync point for (no caller is recorded there)
_TRACE_SYNC_OPS = ("broadcast", "all_gather", "barrier")
READS = (
    *("rank", "pg_name", "pg_size", "seq", "index", "op", "bytes"),
    *("start_ns", "end_ns", "step", "source"),
)


@dataclass(frozen=True)
class SyncPoint:
    """One call site's small collectives: ``exposed_ms`` the exposed time inside them,
    ``latency_ms`` its part after the last rank arrived (the profiled window's, ms per
    analysed step, mean over the ranks: what findings.exposed_split sets apart), and
    ``gain_ms`` what removing the calls gives back, per step of the run
    (:func:`_gains`)."""

    op: str
    bytes: int
    callsite: str | None
    library_callsite: str | None
    calls_per_step: float
    exposed_ms: float
    latency_ms: float
    per_rank_latency_ms: Mapping[int, float] = field(default_factory=dict)
    gain_ms: float = 0.0
    steps: int = 0  # the steps gain_ms is the mean over


@dataclass(frozen=True)
class SyncPoints:
    """Every sync point, and each rank's latency in any of them (their union, ms per
    analysed step: the part findings.exposed_split sets apart beside the wait)."""

    points: tuple[SyncPoint, ...]
    per_rank_latency_ms: Mapping[int, float]

    @property
    def exposed_ms(self) -> float:
        """Their whole exposed time, mean over ranks (the calls do not overlap)."""
        return float(sum(p.exposed_ms for p in self.points))

    @property
    def latency_ms(self) -> float:
        values = list(self.per_rank_latency_ms.values())
        return float(np.mean(values)) if values else 0.0


def sync_point_calls(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the collective table that are sync points (module docstring)."""
    source = table["source"].astype(str)
    op = table["op"].astype(object)
    nbytes = pd.to_numeric(table["bytes"], errors="coerce")
    small = (nbytes <= SYNC_POINT_BYTES) | ((op == "barrier") & nbytes.isna())
    start = pd.to_numeric(table["start_ns"], errors="coerce")
    end = pd.to_numeric(table["end_ns"], errors="coerce")
    step = pd.to_numeric(table["step"], errors="coerce").fillna(-1)
    traced = source.str.startswith("trace:") & op.isin(_TRACE_SYNC_OPS)
    keep = small & ((source == "run:dist") | traced) & (end >= start) & (step >= 0)
    return table.loc[keep.to_numpy()].copy()


# sync_point_calls' rows as an SQL condition on the call store (store.py): NULL is False
SYNC_POINT_SQL = f"""coalesce(
    (bytes <= {SYNC_POINT_BYTES} OR (op = 'barrier' AND bytes IS NULL))
    AND (source = 'run:dist'
        OR (starts_with(source, 'trace:') AND op IN ({", ".join(repr(o) for o in _TRACE_SYNC_OPS)})))
    AND end_ns >= start_ns AND step >= 0,
    false)"""


def _matched_spans(calls: pd.DataFrame) -> pd.DataFrame:
    """Each call matched on every rank of its group, with the last rank's arrival."""
    calls = calls.assign(
        start_ns=pd.to_numeric(calls["start_ns"]).astype(np.int64),
        end_ns=pd.to_numeric(calls["end_ns"]).astype(np.int64),
        key=pd.to_numeric(calls["seq"], errors="coerce").fillna(
            -1 - pd.to_numeric(calls["index"], errors="coerce").fillna(0)
        ),
        pg_name=calls["pg_name"].astype(str),
    )
    group = calls.groupby(["pg_name", "key"], sort=False)
    size = pd.to_numeric(calls["pg_size"], errors="coerce").fillna(2).clip(lower=2)
    seen = group["rank"].transform("nunique")
    matched = (seen >= size) & (group["op"].transform(lambda o: o.astype(str).nunique()) == 1)
    calls = calls.loc[matched.to_numpy()].copy()
    calls["last_ns"] = calls.groupby(["pg_name", "key"], sort=False)["start_ns"].transform("max")
    return calls


def _keyed(calls: pd.DataFrame) -> pd.DataFrame:
    """rank, group and matching key (seq; else -1 - its order in the group) of calls."""
    seq = pd.to_numeric(calls["seq"], errors="coerce")
    order = pd.to_numeric(calls["index"], errors="coerce").fillna(0)
    return pd.DataFrame(
        {
            "rank": pd.to_numeric(calls["rank"], errors="coerce"),
            "pg_name": calls["pg_name"].astype(str),
            "key": seq.fillna(-1 - order),
            "next_ns": pd.to_numeric(calls["start_ns"], errors="coerce"),
        }
    )


def _next_arrivals(collectives: Table, calls: pd.DataFrame) -> np.ndarray:
    """Each call's rank's arrival at its next call in the same group (NaN: none seen)."""
    key = calls["key"].to_numpy(dtype=float)
    want = pd.DataFrame(
        {
            "rank": calls["rank"].to_numpy(),
            "pg_name": calls["pg_name"].astype(str).to_numpy(),
            "key": np.where(key >= 0, key + 1, key - 1),
            "at": np.arange(len(calls)),
        }
    )
    found = np.full(len(calls), np.nan)
    for piece in collectives.pieces(["rank", "pg_name", "seq", "index", "start_ns"]):
        hit = want.merge(_keyed(piece), on=["rank", "pg_name", "key"])
        found[hit["at"].to_numpy()] = hit["next_ns"].to_numpy(dtype=float)
    return found


def _gains(calls: pd.DataFrame, stragglers: set[int]) -> pd.Series:
    """What removing each matched call gives back to the step (ns, per call): every
    rank then reaches its next collective earlier by the call's time after the last
    rank arrived (its ``tail``, no later than that next arrival), and the step waits
    for the last of them: max(next arrival) - max(next arrival - tail). A rank whose
    tail merely overlaps another rank's work (a peer still computing) gives nothing
    back; a rank a straggler finding names counts no tail (its lateness is costed once,
    under straggler). NaN where a rank's next call is not known."""
    start = calls["start_ns"].to_numpy(dtype=float)
    end = calls["end_ns"].to_numpy(dtype=float)
    nxt = calls["next_ns"].to_numpy(dtype=float)
    tail = np.clip(np.minimum(end, nxt) - np.maximum(calls["last_ns"].to_numpy(), start), 0, None)
    tail[calls["rank"].isin(list(stragglers)).to_numpy()] = 0.0
    frame = pd.DataFrame({"g": calls["group_id"].to_numpy(), "next": nxt, "early": nxt - tail})
    per = frame.groupby("g").agg(last=("next", "max"), early=("early", "max"), n=("next", "size"))
    known = frame.groupby("g")["next"].apply(lambda v: bool(v.notna().all()))
    gain = (per["last"] - per["early"]).where(known)
    return calls["group_id"].map(gain)


def _where(run: Any) -> dict[tuple[int, str, float], tuple[str | None, str | None]]:
    """(rank, group, seq) -> (the user's line, the framework's line) from the run."""
    c = getattr(run, "collectives", None)
    if c is None or not len(c) or "callsite" not in c:
        return {}
    lib = c["library_callsite"] if "library_callsite" in c else pd.Series(None, index=c.index)
    rows = c[c["callsite"].notna() | lib.notna()]
    out = {}
    for rank, pg, seq, user, framework in zip(
        rows["rank"],
        rows["pg_name"].astype(str),
        pd.to_numeric(rows["seq"], errors="coerce"),
        rows["callsite"],
        lib[rows.index],
        strict=True,
    ):
        out[(int(rank), pg, float(seq))] = (
            user if isinstance(user, str) else None,
            framework if isinstance(framework, str) else None,
        )
    return out


def _rank_lengths(trace: Any, spans: pd.DataFrame) -> tuple[float, float]:
    """(exposed ms, exposed ms after the last arrival) per analysed step inside spans."""
    from gpudiag.analysis.breakdown import component_intervals, step_window_bounds

    lo, hi = step_window_bounds(trace)
    if not len(lo) or not len(spans):
        return 0.0, 0.0
    exposed = component_intervals(trace, ("comm_exposed",))["comm_exposed"]
    start = spans["start_ns"].to_numpy(np.int64)
    end = spans["end_ns"].to_numpy(np.int64)
    after = np.maximum(spans["last_ns"].to_numpy(np.int64), start)
    whole = iv.union(start, end)
    tail = iv.union(after, np.maximum(end, after))
    inside = iv.per_window_length(iv.intersect(exposed, whole), lo, hi).mean() / 1e6
    late = iv.per_window_length(iv.intersect(exposed, tail), lo, hi).mean() / 1e6
    return float(inside), float(late)


def sync_points(
    traces: list[Any], collectives: Table, run: Any = None, stragglers: Iterable[int] = ()
) -> SyncPoints | None:
    """The run's sync points: their exposed time in each traced rank's analysed steps,
    and what removing them gives back over the run's steps (``stragglers``: the ranks a
    straggler finding names, :func:`_gains`); None without any."""
    if collectives is None or not len(collectives) or not traces:
        return None
    pieces = [sync_point_calls(p) for p in collectives.pieces(list(READS))]
    calls = pd.concat([p for p in pieces if len(p)] or [pd.DataFrame()], ignore_index=True)
    if calls.empty:
        return None
    calls = _matched_spans(calls)
    if calls.empty:
        return None
    calls["next_ns"] = _next_arrivals(collectives, calls)
    calls["group_id"] = calls.groupby(["pg_name", "key"], sort=False).ngroup()
    calls["gain_ns"] = _gains(calls, {int(r) for r in stragglers})
    run_steps = _run_steps(collectives)
    where = _where(run)
    places = [
        where.get((int(r), str(pg), float(s)), (None, None))
        for r, pg, s in zip(calls["rank"], calls["pg_name"], calls["key"], strict=True)
    ]
    calls["callsite"] = [p[0] for p in places]
    calls["library_callsite"] = [p[1] for p in places]
    by_rank = {t.meta.rank: t for t in traces}
    traced = calls[calls["rank"].isin(list(by_rank))]
    union = {r: _rank_lengths(by_rank[r], g)[1] for r, g in traced.groupby("rank")}
    points = []
    site = ["op", "bytes", "callsite", "library_callsite"]
    for key, g in calls.fillna({"callsite": "", "library_callsite": ""}).groupby(site):
        op, nbytes, user, framework = key
        lengths = {
            int(r): _rank_lengths(by_rank[r], rows) for r, rows in g.groupby("rank") if r in by_rank
        }
        if not lengths:
            continue
        per_rank = {r: late for r, (_, late) in lengths.items()}
        gain = _gain_per_step(g, run_steps)
        if gain is None:
            continue
        points.append(
            SyncPoint(
                op=str(op),
                bytes=int(nbytes) if nbytes == nbytes else 0,
                callsite=user or None,
                library_callsite=framework or None,
                calls_per_step=float(g["step"].isin(run_steps).sum())
                / max(g["rank"].nunique(), 1)
                / max(len(run_steps), 1),
                exposed_ms=float(np.mean([e for e, _ in lengths.values()])),
                latency_ms=float(np.mean(list(per_rank.values()))),
                per_rank_latency_ms=per_rank,
                gain_ms=gain,
                steps=len(run_steps),
            )
        )
    if not points:
        return None
    points.sort(key=lambda p: -p.exposed_ms)
    return SyncPoints(tuple(points), {int(r): float(v) for r, v in union.items()})


def _run_steps(collectives: Table) -> list[int]:
    """The steps the run's collectives carry, the first (set-up and warm-up: a
    framework's start-up barriers and broadcasts) left out where there are 3 or more."""
    seen: set[int] = set()
    for piece in collectives.pieces(["step"]):
        step = pd.to_numeric(piece["step"], errors="coerce").dropna()
        seen.update(int(x) for x in step[step >= 0].unique())
    steps = sorted(seen)
    return steps[1:] if len(steps) >= 3 else steps


def _gain_per_step(calls: pd.DataFrame, steps: list[int]) -> float | None:
    """A call site's gain (ms) per step of the run (``steps``): the sum over its calls
    in those steps, spread over them (a call made every N steps costs 1/N of its gain
    per step). None for a site seen in fewer than :data:`MIN_STEPS` of them (a one-off
    call is not a per-step synchronisation point)."""
    one = calls.drop_duplicates("group_id")
    one = one[one["step"].isin(steps)]
    if one["step"].nunique() < MIN_STEPS or not steps:
        return None
    return float(one["gain_ns"].fillna(0.0).sum()) / 1e6 / len(steps)


def _short(callsite: str | None) -> str | None:
    """``file.py:line in func`` of a callsite, its folder left out."""
    if not callsite:
        return None
    path, _, rest = callsite.partition(":")
    return f"{os.path.basename(path)}:{rest}"


def _what(p: SyncPoint) -> str:
    """ "An 8 B broadcast issued by the framework at file.py:265 in f (from your
    train.py:54 in main)"."""
    size = f"{p.bytes} B " if p.op != "barrier" else ""
    article = "An" if (size or p.op)[0] in "8aeiou" else "A"
    user, framework = _short(p.callsite), _short(p.library_callsite)
    if framework:
        mine = f" (from your {user})" if user else ""
        return f"{article} {size}{p.op} issued by the framework at {framework}{mine}"
    return f"{article} {size}{p.op}" + (f" at {user}" if user else "")


SYNC_FIX_METRIC = (
    "A small collective every step is a synchronisation point: each rank stops there until "
    "the slowest arrives, then pays the call's latency; bucket size, overlap, no_sync() or "
    "gradient compression do not give it back. If it reduces a logged metric (Lightning's "
    "self.log(..., sync_dist=True) on a metric logged each step, which runs a barrier and an "
    "all_reduce; a .item() of an all-reduced loss; an HF Trainer's per-step gather), reduce it "
    "every N steps or at epoch end instead: sync_dist=False for on_step metrics (keep it for "
    "on_epoch ones), or keep the value on the device and reduce it once per log interval."
)
SYNC_FIX_FRAMEWORK = (
    "The framework issues this call itself each step: a synchronisation point, not gradient "
    "traffic, so bucket size, overlap, no_sync() or gradient compression do not give it "
    "back. Its time after the last rank arrives is the call's own latency (on a busy CPU "
    "host, gloo's thread waiting to be scheduled); its wait before is the ranks' arrival "
    "skew, which moves to the next collective if the call goes. Where the framework lets you "
    "skip it (a setting, a newer version), do; else count it as the framework's cost per "
    "step, and give the ranks' gloo threads a core."
)

SYNC_FIX_UNKNOWN = (
    "A small collective every step is a synchronisation point: each rank stops there until "
    "the slowest arrives, then pays the call's latency; bucket size, overlap, no_sync() or "
    "gradient compression do not give it back. Which code issued it is not recorded (a "
    "trace's call; run under gpudiag trace to have its line): DDP broadcasts the module's "
    "buffers (BatchNorm statistics) from rank 0 in every forward unless "
    "DDP(broadcast_buffers=False); a logged metric's all_reduce or a framework's flag "
    "broadcast are others. Make it less often where you can."
)


def _fix(p: SyncPoint) -> str:
    """The advice that fits the call: a metric, a framework's own, or not known."""
    framework = p.library_callsite or ""
    if not framework and not p.callsite:
        return SYNC_FIX_UNKNOWN
    if not framework or p.op == "all_reduce" or "_sync_ddp" in framework:
        return SYNC_FIX_METRIC
    return SYNC_FIX_FRAMEWORK


def sync_point_findings(
    points: SyncPoints | None,
    step_ms: float,
    scale: float = 1.0,
    runq_share: float | None = None,
) -> list[Finding]:
    """One ``sync_point`` finding per call site whose gain per step (:func:`_gains`, over
    the run's steps) is a finding by itself: what removing the calls gives back, their
    time after the last rank arrived on the ranks that decide the step. The wait before
    it is the ranks' arrival skew and moves to the next collective if the call goes; a
    named straggler's own time in it is costed under straggler. The exposed time (the
    profiled window's, times ``scale``: findings.window_scale) is what the
    exposed_communication finding sets apart. Rated like exposed communication under
    the host's load."""
    if points is None:
        return []
    found = []
    for p in points.points:
        cost, exposed = p.gain_ms, p.exposed_ms * scale
        if severity_for(cost, step_ms) is None:
            continue
        title = (
            f"{_what(p)}, {p.calls_per_step:.3g} per step: a synchronisation point, not "
            f"gradient transfer. Over the run's {p.steps} steps, removing it gives back about "
            f"{ms_text(cost)} ms per step ({pct_text(100 * cost / step_ms)} of the step): its "
            "time after the last rank arrived, on the rank the step then waits for; in the "
            f"profiled steps it held the ranks {ms_text(exposed)} ms per step outside compute "
            f"(mean over ranks; {ms_text(p.latency_ms * scale)} ms of it after the last rank "
            "arrived, the rest waiting for late peers)"
        )
        if host_starved(runq_share):
            title += STARVED_HOST_WORDS.format(share=runq_share)
        found.append(
            Finding(
                kind="sync_point",
                severity=severity_under_load(cost, step_ms, runq_share),
                cost_ms_per_step=cost,
                ranks=sorted(int(r) for r in p.per_rank_latency_ms),
                title=title,
                evidence={
                    "op": p.op,
                    "bytes": p.bytes,
                    "calls_per_step": round(p.calls_per_step, 3),
                    "callsite": p.callsite,
                    "library_callsite": p.library_callsite,
                    "exposed_ms": ms(exposed),
                    "after_last_arrival_ms": ms(p.latency_ms * scale),
                    "per_rank_after_last_arrival_ms": {
                        str(r): ms(v * scale) for r, v in sorted(p.per_rank_latency_ms.items())
                    },
                    "gives_back_ms": ms(cost),
                    "steps_counted": p.steps,
                    "step_ms": ms(step_ms),
                    **({"runq_share_of_step": round(runq_share, 3)} if runq_share else {}),
                },
                fix=_fix(p),
                location=p.callsite.split(" in ")[0] if p.callsite else None,
            )
        )
    return found
