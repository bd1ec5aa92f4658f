"""Live state of a running job (`gpudiag watch`): pure functions over recent rows.

:class:`LiveWindow` accumulates the rows a :class:`gpudiag.rundir.LiveReader` hands out
and keeps only a bounded window per rank (the last ``steps`` steps, and the collectives
of those steps), so memory and work per refresh stay flat however long the run.
:func:`snapshot` turns the window and the run's current documents into a
:class:`LiveSnapshot`; its :meth:`LiveSnapshot.to_json` is the stable `--json` schema
(docs/live.md).

Lagging ranks are the stragglers of :mod:`gpudiag.analysis.stragglers` (the same
functions `gpudiag analyze` uses) run on the recent window's collectives. A stuck
collective is one that some ranks entered (their ``inflight_live.json``) over
``stuck_after_s`` ago while other members of its process group never arrived.
"""

from __future__ import annotations

import bisect
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from gpudiag import rundir
from gpudiag.analysis import gpu as gpu_health
from gpudiag.analysis import straggler_findings as stf
from gpudiag.analysis import stragglers as strag

DEFAULT_WINDOW_STEPS = 50
DEFAULT_STUCK_AFTER_S = 10.0
# Collectives are written when the rank dumps its Flight Recorder ring (every few to 100
# steps, at least every 10 s), so the step window for arrivals trails the step table.
_STEP_SLACK = 200
_MAX_COLLECTIVES_PER_RANK = 50_000


@dataclass
class RankLive:
    rank: int
    node: int | None
    step: int | None
    steps_per_s: float | None
    last_step_ms: float | None
    median_step_ms: float | None
    since_last_step_s: float | None
    data_wait_ms: float | None  # median DataLoader wait per step over the window
    memory_bytes: int | None  # GPU memory used on the rank's device (NVML), else None
    status: str | None  # status.json's, once the rank ended
    # mean arrival after the first rank at the collectives of the lagging window (ms): what
    # tells the lagging rank, whose step is no longer than the others' (they wait for it)
    late_ms: float | None = None


@dataclass
class StuckCollective:
    pg: str | None
    seq: int | None
    op: str | None
    waiting_s: float
    arrived: list[int]
    missing: list[int]


@dataclass
class GpuLive:
    gpu: int | None
    util_gpu: float | None
    mem_used: int | None
    mem_total: int | None
    throttle_reasons: int | None  # NVML clock-event reason bits
    throttled: list[str]  # the reasons among them that slow a busy GPU (thermal, power...)
    power_w: float | None
    temp_c: float | None


@dataclass
class NodeLive:
    node: int
    cpu_percent: float | None
    mem_used: int | None
    mem_total: int | None
    gpus: list[GpuLive] = field(default_factory=list)


@dataclass
class LiveSnapshot:
    state: str  # one of rundir.RUN_STATUSES, or rundir.LIVE_LOST_STATES (gone, unreadable)
    failed_ranks: list[int]
    t_ns: int
    window_steps: int
    ranks: list[RankLive]
    lagging: list[int]
    stuck: list[StuckCollective]
    nodes: list[NodeLive]
    lagging_window: list[int] | None = None  # [first, last] step the lagging ranks cover
    # one line per file of the run that is there but could not be read at this refresh
    # (permission denied, a directory or a FIFO in its place, not JSON), each naming it
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["warnings"] = [str(w) for w in self.warnings]
        return out


class LiveWindow:
    """Recent rows of a run, bounded per rank."""

    def __init__(self, steps: int = DEFAULT_WINDOW_STEPS) -> None:
        self.steps_kept = steps
        self.steps: dict[int, deque[dict[str, Any]]] = {}
        # rank -> (pg_name, seq) -> arrival row; FR rows win over call stamps
        self.arrivals: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
        self.host: dict[int, dict[str, Any]] = {}
        self.gpus: dict[tuple[int, int], dict[str, Any]] = {}
        self.collectives_changed = True
        self._newest_step: dict[int, int] = {}
        # (rank, pg_name) -> highest seq this rank is known to have issued
        self.max_seq: dict[tuple[int, str], int] = {}

    def add(self, batch: rundir.LiveBatch) -> None:
        for rank, rows in batch.rank_rows.get(rundir.STEPS, {}).items():
            if rows:
                kept = self.steps.setdefault(rank, deque(maxlen=self.steps_kept + _STEP_SLACK))
                kept.extend(r for r in rows if isinstance(r.get("end_ns"), int))
        for rank, rows in batch.rank_rows.get(rundir.COLLECTIVES, {}).items():
            self._add_arrivals(rank, rows, "enqueue_ns", fr=True)
        for rank, rows in batch.rank_rows.get(rundir.COLLECTIVE_TIMES, {}).items():
            self._add_arrivals(rank, rows, "call_ns", fr=False)
        for node, rows in batch.node_rows.get(rundir.HOST_SAMPLES, {}).items():
            if rows:
                self.host[node] = rows[-1]
        for node, rows in batch.node_rows.get(rundir.GPU_SAMPLES, {}).items():
            for row in rows:
                if isinstance(row.get("gpu"), int):
                    self.gpus[(node, row["gpu"])] = row

    def _add_arrivals(self, rank: int, rows: list[dict[str, Any]], column: str, fr: bool) -> None:
        if not rows:
            return
        table = self.arrivals.setdefault(rank, {})
        for row in rows:
            seq, arrival = row.get("seq"), row.get(column)
            if not isinstance(seq, int) or not isinstance(arrival, int) or row.get("op") == "lost":
                continue
            key = (str(row.get("pg_name")), seq)
            if seq > self.max_seq.get((rank, key[0]), -1):
                self.max_seq[(rank, key[0])] = seq
            if key in table and not fr:
                continue  # the Flight Recorder's enqueue time, as `analyze` uses
            table[key] = {
                "pg_name": key[0],
                "seq": seq,
                "op": row.get("op"),
                "start_ns": arrival,
                "step": row.get("step") if fr else None,
            }
            step = table[key]["step"]
            if isinstance(step, int) and step > self._newest_step.get(rank, -1):
                self._newest_step[rank] = step
            self.collectives_changed = True
        self._trim(rank)

    def window_end(self) -> int | None:
        """The newest step every rank has arrivals for (None before any): where the
        lagging window ends, whichever rank dumped its collectives last."""
        if not self._newest_step or set(self.steps) - set(self._newest_step):
            return None  # a rank with steps and no arrivals yet: its window is unknown
        return min(self._newest_step.values())

    def _trim(self, rank: int) -> None:
        """Drop arrivals older than the window: those of steps ``steps_kept`` before the
        newest step *every* rank has arrivals for (a rank that dumped its Flight
        Recorder later than the others sets where the window ends: trimmed on the rank's
        own newest step, the rank that dumped first kept none of the window's steps, and
        the lagging window matched a few collectives or none: "Lagging ranks: none"
        beside rank 1 50 ms late, probe 31k N2), and those issued before the oldest kept
        step row; and the oldest beyond a hard cap. Rows come in time order, so the
        table is rebuilt only when its first row is stale."""
        table = self.arrivals[rank]
        steps = self.steps.get(rank)
        oldest = steps[0]["end_ns"] if steps else None
        newest = self.window_end()
        floor = None if newest is None else newest - self.steps_kept

        def keep(row: dict[str, Any]) -> bool:
            if oldest is not None and row["start_ns"] < oldest:
                return False
            return floor is None or row["step"] is None or row["step"] >= floor

        if table and not keep(table[next(iter(table))]):
            table = {k: v for k, v in table.items() if keep(v)}
        if len(table) > _MAX_COLLECTIVES_PER_RANK:
            table = dict(list(table.items())[-_MAX_COLLECTIVES_PER_RANK:])
        self.arrivals[rank] = table


# --------------------------------------------------------------------------- snapshot


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def rank_live(
    rank: int, steps: deque[dict[str, Any]] | None, window: int, now_ns: int
) -> tuple[int | None, float | None, float | None, float | None, float | None, float | None]:
    """(step, steps/s, last ms, median ms, s since the last step, median data wait ms)
    over the last ``window`` steps."""
    rows = list(steps)[-window:] if steps else []
    if not rows:
        return None, None, None, None, None, None
    last = rows[-1]
    durations = [
        (r["end_ns"] - r["start_ns"]) / 1e6 for r in rows if isinstance(r.get("start_ns"), int)
    ]
    span_s = (last["end_ns"] - rows[0]["end_ns"]) / 1e9
    if len(rows) >= 2 and span_s > 0:
        rate: float | None = (len(rows) - 1) / span_s
    elif durations and durations[-1] > 0:
        rate = 1000.0 / durations[-1]
    else:
        rate = None
    data = [r["data_ns"] / 1e6 for r in rows if isinstance(r.get("data_ns"), int)]
    return (
        last.get("step"),
        rate,
        durations[-1] if durations else None,
        _median(durations),
        max(0.0, (now_ns - last["end_ns"]) / 1e9),
        _median(data),
    )


def _step_of(steps: list[dict[str, Any]], t_ns: int) -> int | None:
    """The step a collective issued at ``t_ns`` belongs to (first step ending after it)."""
    ends = [r["end_ns"] for r in steps]
    i = bisect.bisect_left(ends, t_ns)
    if i < len(steps):
        return steps[i].get("step")
    return None


def window_collectives(
    win: LiveWindow, window: int
) -> tuple[pd.DataFrame, pd.DataFrame, list[int] | None]:
    """The recent collectives every rank has written (arrival = enqueue), shaped as
    `analyze` hands them to the straggler functions, and the matching steps."""
    frames: list[dict[str, Any]] = []
    latest: dict[int, int] = {}
    for rank, table in win.arrivals.items():
        steps = list(win.steps.get(rank, ()))
        for row in table.values():
            step = row["step"]
            if step is None and steps:
                step = _step_of(steps, row["start_ns"])
            if not isinstance(step, int) or step < 1:  # step 0: warm-up, as in analyze
                continue
            frames.append({**row, "rank": rank, "step": step})
            latest[rank] = max(latest.get(rank, step), step)
    if len(latest) < 2:
        return pd.DataFrame(), pd.DataFrame(), None
    last = min(latest.values())  # the newest step every rank has collectives for
    first = last - window + 1
    coll = pd.DataFrame(frames)
    coll = coll[(coll["step"] >= first) & (coll["step"] <= last)]
    if coll.empty:
        return coll, pd.DataFrame(), None
    coll = coll.sort_values(["rank", "pg_name", "start_ns"], ignore_index=True)
    coll["index"] = coll.groupby(["rank", "pg_name"]).cumcount()
    step_rows = [
        {"rank": r, "step": s["step"], "start_ns": s["start_ns"], "end_ns": s["end_ns"]}
        for r, rows in win.steps.items()
        for s in rows
        if isinstance(s.get("step"), int) and first <= s["step"] <= last
    ]
    steps_frame = pd.DataFrame(step_rows, columns=["rank", "step", "start_ns", "end_ns"])
    return coll, steps_frame, [int(coll["step"].min()), last]


def lagging_ranks(win: LiveWindow, window: int) -> tuple[list[int], list[int] | None]:
    """The ranks of the straggler finding `analyze` would make, over the last
    ``window`` steps: the same matching, thresholds and net-cost rule."""
    ranks, span, _ = lagging_and_lateness(win, window)
    return ranks, span


def lagging_and_lateness(
    win: LiveWindow, window: int
) -> tuple[list[int], list[int] | None, dict[int, float]]:
    """:func:`lagging_ranks`, and each rank's mean arrival after the first rank at the
    window's collectives (ms; the straggler table's ``mean_skew_ms``)."""
    coll, steps_frame, span = window_collectives(win, window)
    if coll.empty:
        return [], None, {}
    skew = strag.arrival_skew(coll)
    if skew is None or skew.empty:
        return [], span, {}
    slow = strag.stragglers(skew, steps_frame if len(steps_frame) else None)
    late = {
        int(r): round(float(v), 3)
        for r, v in zip(
            slow["rank"], pd.to_numeric(slow["mean_skew_ms"], errors="coerce"), strict=True
        )
        if v == v  # not NaN
    }
    step_ms = (
        float(((steps_frame["end_ns"] - steps_frame["start_ns"]) / 1e6).mean())
        if len(steps_frame)
        else float("nan")
    )
    named = {r for f in stf.straggler_findings(slow, step_ms) for r in f.ranks}
    return sorted(int(r) for r in named), span, late


def stuck_collectives(
    inflight: dict[int, dict[str, Any]],
    ranks: list[int],
    ended: set[int],
    now_ns: int,
    stuck_after_s: float,
    reached: dict[tuple[int, str], int] | None = None,
) -> list[StuckCollective]:
    """Collectives some ranks have waited in for over ``stuck_after_s``, with the
    members of the group that never arrived.

    ``inflight`` is each rank's inflight_live.json: ``inflight`` (calls the recorder saw
    enter and not leave) and ``fr_pending`` (Flight Recorder entries of a rank idle for
    seconds: issued, maybe completed). A rank has arrived at (pg, seq) when it holds
    that entry or is known (``reached``: its collective rows) to have issued a later
    seq of the group. A pending entry is shown only at the rank's frontier (its last
    seq in the group) and only when some member never arrived."""
    known: dict[tuple[int, str], int] = dict(reached or {})
    entries: list[tuple[int, dict[str, Any], bool]] = []
    for rank, doc in inflight.items():
        if rank in ended:
            continue
        for name, entered in (("inflight", True), ("fr_pending", False)):
            for entry in doc.get(name) or []:
                if not isinstance(entry, dict) or not isinstance(entry.get("enter_ns"), int):
                    continue
                entries.append((rank, entry, entered))
                seq = entry.get("seq")
                if isinstance(seq, int):
                    k = (rank, str(entry.get("pg_name")))
                    known[k] = max(known.get(k, -1), seq)
    groups: dict[tuple[str, int | None], dict[str, Any]] = {}
    for rank, entry, entered in entries:
        seq = entry.get("seq") if isinstance(entry.get("seq"), int) else None
        pg = str(entry.get("pg_name"))
        if not entered and seq != known.get((rank, pg)):
            continue  # a pending entry behind this rank's frontier: it completed
        g = groups.setdefault(
            (pg, seq),
            {
                "op": entry.get("op"),
                "enter_ns": entry["enter_ns"],
                "arrived": set(),
                "entered": False,
            },
        )
        g["enter_ns"] = min(g["enter_ns"], entry["enter_ns"])
        g["arrived"].add(rank)
        g["entered"] = g["entered"] or entered
        members = entry.get("pg_ranks")
        if isinstance(members, list) and all(isinstance(m, int) for m in members):
            g["members"] = members
    out: list[StuckCollective] = []
    for (pg, seq), g in groups.items():
        waiting = (now_ns - g["enter_ns"]) / 1e9
        if waiting < stuck_after_s:
            continue
        members = g.get("members") or ranks
        arrived = set(g["arrived"])
        if seq is not None:
            arrived |= {m for m in members if known.get((m, pg), -1) >= seq}
        missing = sorted(set(members) - arrived)
        if not g["entered"] and not missing:
            continue
        out.append(
            StuckCollective(
                pg=pg,
                seq=seq,
                op=g["op"],
                waiting_s=round(waiting, 3),
                arrived=sorted(arrived),
                missing=missing,
            )
        )
    return sorted(out, key=lambda s: -s.waiting_s)


def run_state(batch: rundir.LiveBatch) -> tuple[str, list[int]]:
    """(state, failed ranks), in rundir's one status vocabulary. A run still marked
    running is ``failed`` as soon as a rank wrote a failed status, and ``hang`` once
    the watchdog wrote its report; without a manifest the ranks' statuses decide. A run
    directory deleted, moved or replaced while watched is ``gone``, one that cannot be
    listed any more ``unreadable`` (:data:`rundir.LIVE_LOST_STATES`): never ``ok``."""
    failed = sorted(
        (s.get("end_ns") or 0, r) for r, s in batch.statuses.items() if s.get("status") == "failed"
    )
    failed_ranks = [r for _, r in failed]
    for manifest in (batch.manifest, *batch.node_manifests.values()):
        listed = manifest.get("failed_ranks")
        if isinstance(listed, list):
            failed_ranks += [r for r in listed if isinstance(r, int) and r not in failed_ranks]
    state = batch.status
    if state in (None, "running"):
        if batch.hang_report:
            state = "hang"
        elif batch.hang_suspected:
            state = "hang_suspected"  # the job was left running: `watch` goes on
        elif failed_ranks:
            state = "failed"
        elif state is None:
            ranks = set(batch.rank_rows.get(rundir.STEPS, {}))
            done = ranks and all(batch.statuses.get(r, {}).get("status") == "ok" for r in ranks)
            state = "ok" if done else "running"
    return state, failed_ranks


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def node_views(win: LiveWindow) -> list[NodeLive]:
    nodes = sorted(set(win.host) | {n for n, _ in win.gpus})
    out = []
    for n in nodes:
        host = win.host.get(n, {})
        gpus = [
            GpuLive(
                gpu=g,
                util_gpu=_num(row.get("util_gpu")),
                mem_used=_int(row.get("mem_used")),
                mem_total=_int(row.get("mem_total")),
                throttle_reasons=_int(row.get("throttle_reasons")),
                throttled=_throttled(_int(row.get("throttle_reasons"))),
                power_w=_num(row.get("power_w")),
                temp_c=_num(row.get("temp_c")),
            )
            for (node, g), row in sorted(win.gpus.items())
            if node == n
        ]
        out.append(
            NodeLive(
                node=n,
                cpu_percent=_num(host.get("cpu_percent")),
                mem_used=_int(host.get("mem_used")),
                mem_total=_int(host.get("mem_total")),
                gpus=gpus,
            )
        )
    return out


def _throttled(bits: int | None) -> list[str]:
    if not bits:
        return []
    mask = bits & gpu_health.PERF_THROTTLE_MASK
    return [name for bit, name in gpu_health.THROTTLE_BITS.items() if mask & bit]


def _device_index(info: dict[str, Any]) -> int | None:
    device = info.get("device")
    if isinstance(device, str) and device.startswith("cuda:"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return None
    return None


# Up to this many ranks the lagging ranks are recomputed at every refresh (2 s).
SMALL_JOB_RANKS = 16
# The Flight Recorder rows reach the run directory at least this often (capture's
# collectives._DUMP_MAX_AGE_NS): how far the lagging window may trail the newest step;
# while a dump is cheap, as often as every COLLECTIVES_MIN_DELAY_S (collectives.dump_age_ns).
COLLECTIVES_DELAY_S = 10
COLLECTIVES_MIN_DELAY_S = 1


class Lagging:
    """The straggler result, recomputed when new collectives came in, at most every
    ``every_s`` seconds: over a window of tens of steps it moves slowly, and on 64 ranks
    it is most of a refresh's CPU (bench/live.py)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.ranks: list[int] = []
        self.span: list[int] | None = None
        self.late: dict[int, float] = {}
        self._at: float | None = None

    def update(self, win: LiveWindow, window: int) -> tuple[list[int], list[int] | None]:
        now = time.monotonic()
        # a small job's recomputation is cheap: at every refresh that brought collectives,
        # so the window trails the newest step by the collectives' own delay only (a 2 s
        # floor here added up to 2 s to the ~1.5 s between two dumps: probe 31k, D7)
        every = self.every_s if len(win.arrivals) > SMALL_JOB_RANKS else 0.0
        due = self._at is None or now - self._at >= every
        if win.collectives_changed and due:
            self.ranks, self.span, self.late = lagging_and_lateness(win, window)
            win.collectives_changed = False
            self._at = now
        return self.ranks, self.span


def snapshot(
    win: LiveWindow,
    batch: rundir.LiveBatch,
    window: int = DEFAULT_WINDOW_STEPS,
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    lagging: Lagging | None = None,
) -> LiveSnapshot:
    """The live view of the run, from the accumulated window and the latest poll."""
    now = batch.t_ns
    state, failed_ranks = run_state(batch)
    ranks = sorted(set(win.steps) | set(batch.rank_info) | set(batch.statuses))
    views = []
    for r in ranks:
        info = batch.rank_info.get(r, {})
        node = _int(info.get("node_rank"))
        step, rate, last_ms, median_ms, since, data_ms = rank_live(r, win.steps.get(r), window, now)
        gpu = _device_index(info)
        sample = win.gpus.get((node or 0, gpu)) if gpu is not None else None
        views.append(
            RankLive(
                rank=r,
                node=node,
                step=step,
                steps_per_s=_round(rate, 3),
                last_step_ms=_round(last_ms, 3),
                median_step_ms=_round(median_ms, 3),
                since_last_step_s=_round(since, 3),
                data_wait_ms=_round(data_ms, 3),
                memory_bytes=_int(sample.get("mem_used")) if sample else None,
                status=batch.statuses.get(r, {}).get("status"),
            )
        )
    lagging = lagging or Lagging(every_s=0.0)
    lag, span = lagging.update(win, window)
    for view in views:
        view.late_ms = lagging.late.get(view.rank)
    stuck = (
        stuck_collectives(
            batch.inflight, ranks, set(batch.statuses), now, stuck_after_s, win.max_seq
        )
        if state in ("running", "hang", "hang_suspected")
        else []
    )
    return LiveSnapshot(
        state=state,
        failed_ranks=failed_ranks,
        t_ns=now,
        window_steps=window,
        ranks=views,
        lagging=lag,
        stuck=stuck,
        nodes=node_views(win),
        lagging_window=span,
        warnings=list(dict.fromkeys(batch.warnings)),
    )


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- monitor


@dataclass
class LiveUpdate:
    """One refresh of a :class:`LiveMonitor`: the snapshot, and whether the run is still
    being written (some node's manifest says running and its launcher is alive), whatever
    the snapshot's state says already (``failed`` as soon as a rank failed)."""

    snapshot: LiveSnapshot
    still_written: bool


class LiveMonitor:
    """A run followed live: its incremental reader, the bounded window and the lagging
    result, kept between refreshes so each costs only the rows appended since the last.
    ``run`` is what `gpudiag analyze` takes: a run directory, or the per-node
    directories of one multi-node job (a list, or their parent), followed as one job.

    Thread-safe, so several viewers (`gpudiag watch`, dashboard sessions) can share one:
    a refresh within ``min_interval_s`` of the previous one returns that one's update
    instead of polling again, so the cost does not grow with the number of viewers."""

    def __init__(
        self,
        run: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        window: int = DEFAULT_WINDOW_STEPS,
        stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
        min_interval_s: float = 0.0,
    ) -> None:
        self.run = run
        self.window_steps = window
        self.stuck_after_s = stuck_after_s
        self.min_interval_s = min_interval_s
        self.polls = 0  # how many times the run directory was read (tests, benchmarks)
        self.reader = rundir.open_live(run)  # one directory, or one job's node dirs
        self._window = LiveWindow(window)
        self._lagging = Lagging()
        self._lock = threading.Lock()
        self._last: LiveUpdate | None = None
        self._last_at = 0.0

    def refresh(self) -> LiveUpdate:
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last_at < self.min_interval_s:
                return self._last
            batch = self.reader.poll()
            self._window.add(batch)
            snap = snapshot(
                self._window, batch, self.window_steps, self.stuck_after_s, self._lagging
            )
            self.polls += 1
            self._last, self._last_at = LiveUpdate(snap, batch.writing), now
            return self._last
