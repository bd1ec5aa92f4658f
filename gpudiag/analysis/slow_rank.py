"""Why a straggler is slow: where its extra time per step goes, against the median rank.

A rank that arrives last by ``lead_ms`` per step spends that much more on something
the others do not. From the run's steady steps (steady.rank_times: every step, not only
the profiled window) it is split, in this order, into:

* ``data``: more time waiting for its batch (DataLoader ``__next__``);
* ``starved``: more time runnable but waiting for a CPU than its CPU work explains (its
  run-queue delay beyond the others', less what its extra CPU work brings: the others'
  wait per ms on a CPU, and at least one ms per ms), other processes holding its cores,
  nothing the rank does; the training thread's, at most the lead;
* ``compute``: more time on a CPU (ops, or Python between them), with the run-queue wait
  that extra work brings on a shared host (the other ranks' wait per ms on a CPU, at
  least one, times its extra CPU time); the profiled window names the ops (or kernels,
  on a GPU) whose own time per step (without the ops they call) grew the most, or says
  that the extra time is outside any op (Python between them) when the ops' growth
  explains less than half of it;
* ``blocked``: the rest, off the CPU and not waiting for data: sleeping, blocking I/O,
  a lock, a host-side wait of its own. It names the cause only when it explains the lead
  without the run-queue delay of the rank's other threads (intra-op workers the training
  thread waits for, beyond the others'): that may be the host's load, not the rank.

Each part is the slow rank's median per steady step minus the median of the other ranks'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpudiag.analysis import classify as cls
from gpudiag.analysis.steady import RankTime
from gpudiag.numfmt import ms_text

PARTS = ("data", "starved", "compute", "blocked")
# A part explains the lead when it is at least this share of it; the ops named explain
# the extra compute when their growth is at least this share of it.
MAIN_SHARE = 0.5
# The slow rank is called starved when its extra run-queue delay is at least this share
# of its lead: the scheduler, not the rank, made it late.
STARVED_SHARE = 0.5
# The run-queue wait per ms of extra CPU work counted as that work's, at least.
BUSY_STRETCH = 1.0
_CPU_OP_KINDS = ("cpu_op",)
_GPU_OP_KINDS = ("compute",)
TOP_OPS = 3


@dataclass(frozen=True)
class SlowRankCause:
    """The extra ms per step of ``rank`` against the median of the others, by part;
    ``main`` the part that explains most of the lead (None: none does alone)."""

    rank: int
    lead_ms: float
    extra_ms: dict[str, float]
    main: str | None
    ops: list[tuple[str, float]] = field(default_factory=list)
    # its other threads' run-queue delay beyond the training thread's and the others'
    threads_runq_extra_ms: float = 0.0
    # CPU traces: it ran the same ops as the others, as many times per step, and its extra
    # compute is those ops taking longer (a shared or slower core, not more work)
    same_ops_slower: bool = False
    # the growth of every op's own time per step (CPU traces, the training thread): None
    # without traces
    ops_extra_total_ms: float | None = None

    @property
    def outside_ops(self) -> bool:
        """The extra compute is mostly outside any profiled op (Python between them)."""
        return (
            self.main == "compute"
            and not self.same_ops_slower
            and self.ops_extra_total_ms is not None
            and self.ops_extra_total_ms < MAIN_SHARE * self.extra_ms.get("compute", 0.0)
        )

    @property
    def starved(self) -> bool:
        return self.extra_ms.get("starved", 0.0) >= STARVED_SHARE * self.lead_ms > 0

    def sentence(self) -> str:
        """One line a person reads: where the rank's extra time goes."""
        parts = {
            "data": "waiting for its batches (DataLoader)",
            "starved": "runnable but waiting for a CPU (other processes held the cores)",
            "compute": "on the CPU (or waiting for it while computing)",
            "blocked": "off the CPU, outside data loading and collectives (sleeping, "
            "blocking I/O, a lock, or waiting for its own threads)",
        }
        shown = [
            f"{ms_text(self.extra_ms[p])} ms {parts[p]}"
            for p in PARTS
            if self.extra_ms.get(p, 0.0) >= 0.15 * self.lead_ms and self.extra_ms[p] > 0
        ]
        if not shown:
            return ""
        text = (
            f"Per step, rank {self.rank} spends " + "; ".join(shown) + " more than the median rank"
        )
        if self.outside_ops:
            grown = self.ops_extra_total_ms or 0.0
            ops_part = (
                f"the ops' own time grew only {ms_text(grown)} ms"
                if grown >= 0.005
                else "the ops' own time did not grow"
            )
            text += (
                " (mostly outside any profiled op: Python code between the ops, such as a "
                f"loop, a spin or a slow callback; {ops_part})"
            )
        elif self.ops and self.main == "compute":
            text += self._ops_text()
        if self.same_ops_slower:
            text += ", running the same ops as the others, as many times per step, each slower"
        return text + "."

    def _ops_text(self) -> str:
        """The ops that grew most. They are timed in the profiled steps, which the
        profiler slows, while the whole is every steady step's: where their ms add up to
        more than that whole (probe 31m: +396.95 ms of aten::mm in 317.16 ms), each is
        given as its share of the ops' growth instead, so no part exceeds the whole."""
        whole = self.extra_ms.get("compute", 0.0)
        listed = sum(v for _, v in self.ops)
        if listed <= whole:
            shown = ", ".join(f"{n} +{ms_text(v)} ms" for n, v in self.ops)
            return f" (most in {shown}, in the profiled steps)"
        grown = max(self.ops_extra_total_ms or 0.0, listed)
        shown = ", ".join(f"{n} {100 * v / grown:.0f} %" for n, v in self.ops)
        return (
            f" (most in {shown} of the ops' extra time in the profiled steps, which the "
            "profiler slowed)"
        )

    def evidence(self) -> dict[str, object]:
        out: dict[str, object] = {
            "extra_ms_per_step": {p: round(v, 3) for p, v in self.extra_ms.items()},
            "main_cause": self.main,
        }
        if self.threads_runq_extra_ms > 0:
            out["threads_runq_extra_ms_per_step"] = round(self.threads_runq_extra_ms, 3)
        if self.ops:
            out["ops_extra_ms_per_step"] = {n: round(v, 3) for n, v in self.ops}
            out["ops_window"] = "profiled steps"
        if self.ops_extra_total_ms is not None and self.main == "compute":
            out["ops_extra_total_ms_per_step"] = round(self.ops_extra_total_ms, 3)
            out["outside_ops"] = self.outside_ops
        if self.same_ops_slower:
            out["same_ops_slower"] = True
        return out


def explain(
    rank: int, lead_ms: float, times: dict[int, RankTime], traces: Sequence[object] = ()
) -> SlowRankCause | None:
    """Where ``rank``'s extra time per step goes; None without its steady steps, a peer's,
    or the scheduler counters."""
    mine = times.get(rank)
    others = [t for r, t in times.items() if r != rank]
    if mine is None or not others or mine.cpu_ms is None or mine.runq_ms is None:
        return None
    if any(t.cpu_ms is None or t.runq_ms is None for t in others):
        return None
    data = max(mine.data_ms - _median(t.data_ms for t in others), 0.0)
    runq_others = _median(t.runq_ms or 0.0 for t in others)
    cpu_others = _median(t.cpu_ms or 0.0 for t in others)
    # On a shared host every rank waits in the run queue in proportion to its CPU work
    # (its "stretch", the others' run-queue delay per ms on a CPU): a rank with more work
    # waits more for that reason alone, and that wait is its work's. Only the wait beyond
    # its stretch was other processes taking its CPU.
    # The others' stretch understates a busy rank's: ranks that mostly sleep are woken
    # ahead of the queue, a thread that computes without pause shares its core. At least
    # one ms waited per extra ms of CPU work is its work's (a core shared with one other
    # runnable thread; CI, 2026-12-03: 40 ms spun per step gave 23 ms on a CPU and 24 ms
    # in the run queue beside a peer that waited next to nothing: called the host's doing).
    stretch = max(runq_others / cpu_others if cpu_others > 0 else 0.0, BUSY_STRETCH)
    cpu = mine.cpu_ms - cpu_others
    runq_extra = max(mine.runq_ms - runq_others, 0.0)
    induced = min(runq_extra, max(cpu, 0.0) * stretch)
    starved = runq_extra - induced
    # loading in the training thread is on its CPU too: counted once, as data; the run
    # queue its extra work made it wait counts with that work
    compute = max(cpu - data, 0.0) + induced
    starved = min(starved, max(lead_ms, 0.0))
    blocked = max(lead_ms - data - starved - compute, 0.0)
    extra = {"data": data, "starved": starved, "compute": compute, "blocked": blocked}
    # On a CPU the training thread hands its ops to intra-op worker threads and waits for
    # them off the CPU: when those wait for a CPU the step waits too, and that reads as
    # "blocked" (a healthy rank on a busy host, issue 29). Their run-queue delay beyond the
    # training thread's may be that, or not (summed over threads, it overstates: a rank that
    # slept 50 ms showed 9-13 ms): the parts keep the training thread's figures, but
    # "blocked" names the cause only when it does so without that delay. Not when the
    # rank's own extra work explains the lead: a training thread that spins makes its own
    # threads wait (a Lightning rank with 40 ms of extra compute per step).
    threads_extra = 0.0
    if compute < MAIN_SHARE * lead_ms:
        threads_extra = max(_threads_starved(mine, others, cpu_others) - starved, 0.0)
    strength = {**extra, "blocked": max(blocked - threads_extra, 0.0)}
    main = max(extra, key=lambda p: extra[p])
    if lead_ms <= 0 or strength[main] < MAIN_SHARE * lead_ms:
        main_part: str | None = None
    else:
        main_part = main
    ops, ops_total = _extra_ops(rank, traces) if main_part == "compute" else ([], None)
    same = main_part == "compute" and _same_ops_slower(
        rank, traces, max(cpu - data, 0.0), cpu_others
    )
    return SlowRankCause(rank, lead_ms, extra, main_part, ops, threads_extra, same, ops_total)


def _threads_starved(mine: RankTime, others: list[RankTime], cpu_others: float) -> float:
    """The run-queue delay of all of ``mine``'s threads beyond the others' median and beyond
    what its own extra CPU work brings (as for the training thread: the others' delay per
    ms on a CPU); 0 without the counters."""
    if mine.threads_runq_ms is None or mine.cpu_ms is None:
        return 0.0
    if any(t.threads_runq_ms is None for t in others):
        return 0.0
    theirs = _median(t.threads_runq_ms or 0.0 for t in others)
    stretch = theirs / cpu_others if cpu_others > 0 else 0.0
    induced = max(min(mine.threads_runq_ms, mine.cpu_ms * stretch) - theirs, 0.0)
    return max(mine.threads_runq_ms - theirs - induced, 0.0)


def _median(values: Iterable[float]) -> float:
    arr = np.fromiter(values, dtype=float)
    return float(np.median(arr)) if len(arr) else 0.0


def _extra_ops(rank: int, traces: Sequence[object]) -> tuple[list[tuple[str, float]], float | None]:
    """The ops (CPU traces: their own time, without the ops they call, so nested ops are
    not counted twice) or kernels (GPU traces) whose time per profiled step is the most
    above the other ranks' median, with that excess in ms; and the excess of all ops
    together (None without traces)."""
    per_rank: dict[int, pd.Series] = {}
    for trace in traces:
        table = _op_ms_per_step(trace)
        if table is not None:
            per_rank[int(trace.meta.rank)] = table  # type: ignore[attr-defined]
    if rank not in per_rank or len(per_rank) < 2:
        return [], None
    frame = pd.DataFrame(per_rank).fillna(0.0)
    others = frame.drop(columns=[rank]).median(axis=1)
    excess = (frame[rank] - others).sort_values(ascending=False)
    total = float(frame[rank].sum() - others.sum())
    return [(str(n), float(v)) for n, v in excess.head(TOP_OPS).items() if v > 0], total


def _op_ms_per_step(trace: object) -> pd.Series | None:
    events = getattr(trace, "events", None)
    if events is None or len(events) == 0 or "step" not in events:
        return None
    kind = cls.kinds(events)
    gpu = events["is_gpu"].to_numpy()
    if gpu.any():
        mask = gpu & cls.kind_in(kind, _GPU_OP_KINDS)
    else:
        mask = events["main_thread"].to_numpy() & cls.kind_in(kind, _CPU_OP_KINDS)
    ops = events[mask & (pd.to_numeric(events["step"], errors="coerce").fillna(-1) >= 0).to_numpy()]
    steps = ops["step"].nunique()
    if not steps:
        return None
    own = ops["dur_ns"] if gpu.any() else _self_ns(ops)
    return own.groupby(ops["name"].astype(str), observed=True).sum() / steps / 1e6


def _self_ns(ops: pd.DataFrame) -> pd.Series:
    """Each op's own time: its duration less that of the ops directly inside it (one
    thread's ops nest)."""
    ops = ops.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
    starts = ops["start_ns"].to_numpy(dtype=np.int64)
    ends = ops["end_ns"].to_numpy(dtype=np.int64)
    own = ops["dur_ns"].to_numpy(dtype=np.float64).copy()
    open_ops: list[int] = []
    for i in range(len(starts)):
        while open_ops and ends[open_ops[-1]] <= starts[i]:
            open_ops.pop()
        if open_ops:
            own[open_ops[-1]] -= min(ends[i], ends[open_ops[-1]]) - starts[i]
        open_ops.append(i)
    return pd.Series(np.maximum(own, 0.0), index=ops.index)


# Per op name, calls per step within this many (or this share) of the others' median:
# the same work.
SAME_CALLS_ABS = 0.2
SAME_CALLS_SHARE = 0.05
# The ops' slowdown must be at least this share of the CPU time's (the profiled window's
# ops against every steady step's CPU time: the profiler's own overhead and Python
# between the ops slow down too, so not all of it).
SAME_SLOWDOWN = 1 / 3
# A shared core slows the same work's CPU time (on-CPU, not the run queue) by at most
# about this share: two hardware threads on one core each run at no less than about half
# speed. A rank that needed more than twice the others' CPU time did more work, whatever
# its ops' wall times say (CI, 2026-12-03: a Lightning rank spinning 40 ms per step beside
# other jobs took 3.9 times the others' CPU time, and its ops, preempted more because it
# spun, were slower too: called a shared core).
SHARED_CORE_MAX_EXTRA_CPU = 1.0


def _same_ops_slower(
    rank: int, traces: Sequence[object], extra_cpu_ms: float, cpu_others_ms: float
) -> bool:
    """On CPU traces: ``rank``'s training thread ran the same ops as the other ranks'
    median, as many times per step, and they were slowed down at least SAME_SLOWDOWN as
    much as its CPU time was (a core shared with other work slows everything on it
    alike; each relative to the others' median), and its CPU time is no more than a
    shared core explains (SHARED_CORE_MAX_EXTRA_CPU). A rank that does more ops, or spins
    in Python between them, fails one test: its ops are not slower, or its CPU time is far
    more than theirs."""
    counts: dict[int, pd.Series] = {}
    top_ms: dict[int, float] = {}
    for trace in traces:
        ops = _main_thread_ops(trace)
        if ops is None:
            return False  # a GPU trace, or no steps: not this question
        steps = ops["step"].nunique()
        rank_of = int(trace.meta.rank)  # type: ignore[attr-defined]
        counts[rank_of] = ops.groupby(ops["name"].astype(str), observed=True).size() / steps
        top_ms[rank_of] = float(ops["dur_ns"][_top_level(ops)].sum()) / steps / 1e6
    if rank not in counts or len(counts) < 2 or extra_cpu_ms <= 0:
        return False
    if extra_cpu_ms > SHARED_CORE_MAX_EXTRA_CPU * cpu_others_ms:
        return False
    frame = pd.DataFrame(counts).fillna(0.0)
    others = frame.drop(columns=[rank]).median(axis=1)
    allowed = np.maximum(SAME_CALLS_ABS, SAME_CALLS_SHARE * others)
    if ((frame[rank] - others).abs() > allowed).any():
        return False
    others_top = _median(v for r, v in top_ms.items() if r != rank)
    if others_top <= 0 or cpu_others_ms <= 0:
        return False
    ops_slowdown = (top_ms[rank] - others_top) / others_top
    cpu_slowdown = extra_cpu_ms / cpu_others_ms
    return ops_slowdown > 0 and ops_slowdown >= SAME_SLOWDOWN * cpu_slowdown


def _main_thread_ops(trace: object) -> pd.DataFrame | None:
    """The training thread's ops in the trace's steps; None on a GPU trace or without
    steps."""
    events = getattr(trace, "events", None)
    if events is None or len(events) == 0 or "step" not in events:
        return None
    if events["is_gpu"].to_numpy().any():
        return None
    kind = cls.kinds(events)
    mask = events["main_thread"].to_numpy() & cls.kind_in(kind, _CPU_OP_KINDS)
    in_step = (pd.to_numeric(events["step"], errors="coerce").fillna(-1) >= 0).to_numpy()
    ops = events[mask & in_step].sort_values("start_ns", kind="stable")
    return ops if len(ops) else None


def _top_level(ops: pd.DataFrame) -> np.ndarray:
    """Mask of the ops no earlier op (sorted by start) still encloses: nested ops'
    time is counted once, in their outermost op."""
    ends = ops["end_ns"].to_numpy(dtype=np.int64)
    before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], ends[:-1])))
    return ops["start_ns"].to_numpy(dtype=np.int64) >= before
