"""Launcher-side hang watchdog.

Progress is the size/mtime of each local rank's step and collective tables. When none
has changed for ``timeout_s`` the watchdog asks every local rank for a dump (SIGUSR1:
Python stacks; a request file: in-flight collectives, see :mod:`gpudiag.capture.hangdump`),
waits briefly for the answers, writes ``hang_report.json`` and calls ``on_hang(report)``.
The launcher then ends the job.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture.hangdump import request_path

POLL_S = 0.5
DUMP_WAIT_S = 5.0
_PROGRESS_TABLES = (rundir.STEPS, rundir.COLLECTIVES, rundir.COLLECTIVE_TIMES, rundir.DDP_STATS)
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_LIBRARY_PARTS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}gpudiag{os.sep}",
    "<frozen ",
    "runpy.py",
    f"{os.sep}threading.py",
    f"{os.sep}importlib{os.sep}",
)


class HangWatchdog:
    """Background thread that fires once when no local rank progresses for timeout_s.

    It is armed once some rank has written a step or collective row."""

    def __init__(
        self,
        run_dir: Path,
        timeout_s: float,
        on_hang: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.timeout_s = float(timeout_s)
        self.on_hang = on_hang
        self.poll_s = poll_s
        self.fired = False
        self.report: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_signature: tuple = ()
        self._last_progress = time.monotonic()

    def start(self) -> None:
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="gpudiag-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=DUMP_WAIT_S + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            signature = progress_signature(self.run_dir)
            now = time.monotonic()
            if signature != self._last_signature:
                self._last_signature = signature
                self._last_progress = now
                continue
            if now - self._last_progress >= self.timeout_s and _armed(signature):
                self._fire(now - self._last_progress)
                return

    def _fire(self, idle_s: float) -> None:
        self.fired = True
        ranks = _local_ranks(self.run_dir)
        requested_ns = time.time_ns()
        for rank, pid in ranks.items():
            request_dump(self.run_dir, rank, pid)
        _wait_for_dumps(self.run_dir, list(ranks), requested_ns)
        self.report = build_hang_report(self.run_dir, idle_s, sorted(ranks), requested_ns)
        rundir.write_json_atomic(self.run_dir / rundir.HANG_REPORT, self.report)
        if self.on_hang is not None:
            self.on_hang(self.report)


def _armed(signature: tuple) -> bool:
    """Some rank has written a table row (a step or a collective). Before that, workers
    are starting (imports, rendezvous: the elastic agent's timeouts cover those)."""
    return any(table > 0 and size > 0 for _rank, table, size, _mtime in signature)


def progress_signature(run_dir: Path) -> tuple:
    parts = []
    for rank in rundir.list_ranks(run_dir):
        rdir = rundir.rank_dir(run_dir, rank)
        paths = [rdir / rundir.RANK_INFO] + [rundir.table_path(rdir, t) for t in _PROGRESS_TABLES]
        for table, path in enumerate(paths):
            try:
                st = path.stat()
            except OSError:
                continue
            parts.append((rank, table, st.st_size, st.st_mtime_ns))
    return tuple(parts)


def _local_ranks(run_dir: Path) -> dict[int, int]:
    """rank -> pid for the ranks whose rank_info names this host (or no host)."""
    host = socket.gethostname()
    out = {}
    for rank in rundir.list_ranks(run_dir):
        info = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.RANK_INFO)
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            continue
        if (info.get("hostname") or info.get("host")) not in (None, host):
            continue
        out[rank] = info["pid"]
    return out


def request_dump(run_dir: Path, rank: int, pid: int) -> None:
    """Ask one worker for its in-flight collectives (file) and Python stacks (SIGUSR1)."""
    path = request_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(time.time_ns()), encoding="utf-8")
    try:
        os.kill(pid, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for_dumps(run_dir: Path, ranks: list[int], requested_ns: int) -> None:
    deadline = time.monotonic() + DUMP_WAIT_S
    while time.monotonic() < deadline:
        if all(_inflight_fresh(run_dir, r, requested_ns) for r in ranks):
            return
        time.sleep(0.1)


def _inflight_fresh(run_dir: Path, rank: int, requested_ns: int) -> bool:
    data = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.INFLIGHT)
    return isinstance(data, dict) and int(data.get("t_ns") or 0) >= requested_ns


# --------------------------------------------------------------------------- report


def top_user_frame(stacks: str) -> str | None:
    """Innermost non-library frame of the thread that was running when dumped (the
    main thread in faulthandler's "Current thread" block, else the first block)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip())
    current = [b for b in blocks if b.startswith("Current thread")]
    for block in current + [b for b in blocks if b not in current]:
        for line in block.splitlines():
            m = _FRAME_RE.match(line)
            if m and not any(p in m["file"] for p in _LIBRARY_PARTS):
                return f"{m['file']}:{m['line']} in {m['func']}"
    return None


def _last_step(run_dir: Path, rank: int, fallback: int | None) -> int | None:
    last = fallback
    for row in rundir.iter_jsonl(rundir.table_path(rundir.rank_dir(run_dir, rank), rundir.STEPS)):
        if isinstance(row.get("step"), int):
            last = row["step"] if last is None else max(last, row["step"])
    return last


def _rank_state(run_dir: Path, rank: int, requested_ns: int) -> dict[str, Any]:
    rdir = rundir.rank_dir(run_dir, rank)
    dump = rundir.read_json(rdir / rundir.INFLIGHT) or {}
    if int(dump.get("t_ns") or 0) < requested_ns:
        dump = {}  # no answer to this request (a blocked GIL, or a dead rank)
    stacks_path = rdir / rundir.STACKS
    stacks = stacks_path.read_text(errors="replace") if stacks_path.is_file() else ""
    inflight = _merge_inflight(dump.get("inflight") or [], dump.get("fr_unfinished") or [])
    return {
        "rank": rank,
        "last_step": _last_step(run_dir, rank, dump.get("last_step")),
        "in_collective": bool(inflight),
        "inflight": inflight,
        "fr_unfinished": len(dump.get("fr_unfinished") or []),
        "top_frame": top_user_frame(stacks),
        "answered": bool(dump),
    }


_INFLIGHT_KEYS = (
    "op",
    "pg_name",
    "pg_ranks",
    "seq",
    "bytes",
    "shape",
    "dtype",
    "callsite",
    "source",
    "enter_ns",
)


def _merge_inflight(entered: list[dict], fr_unfinished: list[dict]) -> list[dict]:
    """The recorder's in-flight calls (they carry the user's line), plus Flight Recorder
    entries not finished that it does not know (NCCL work left after its call returned)."""
    merged = [{k: c.get(k) for k in _INFLIGHT_KEYS} for c in entered]
    known = {(str(c["pg_name"]), c["seq"]) for c in merged}
    for e in fr_unfinished:
        if (str(e.get("pg_name")), e.get("seq")) in known or e.get("seq") is None:
            continue
        merged.append(
            {
                "op": e.get("op"),
                "pg_name": e.get("pg_name"),
                "pg_ranks": e.get("pg_ranks"),
                "seq": e.get("seq"),
                "bytes": e.get("in_bytes"),
                "shape": (e.get("in_sizes") or [None])[0],
                "dtype": e.get("dtype"),
                "callsite": None,
                "source": "flight_recorder",
                "enter_ns": e.get("enqueue_ns"),
            }
        )
    return merged


def build_hang_report(
    run_dir: Path, idle_s: float, ranks: list[int], requested_ns: int = 0
) -> dict[str, Any]:
    states = {r: _rank_state(run_dir, r, requested_ns) for r in ranks}
    verdict, stuck, not_in, desync = hang_verdict(states)
    return {
        "detected_after_s": round(idle_s, 2),
        "t_ns": time.time_ns(),
        "ranks": {str(r): s for r, s in states.items()},
        "stuck_ranks": stuck,
        "ranks_not_in_collective": not_in,
        "desync": desync,
        "verdict": verdict,
    }


def hang_verdict(
    states: dict[int, dict[str, Any]],
) -> tuple[str, list[int], list[int], dict[str, Any] | None]:
    """One line naming who waits where and who never arrived (or who disagrees)."""
    waiting: dict[tuple[str, int], dict[int, dict]] = {}
    for rank, state in states.items():
        for c in state["inflight"]:
            waiting.setdefault((str(c.get("pg_name")), c.get("seq") or 0), {})[rank] = c
    stuck = sorted(r for r, s in states.items() if s["in_collective"])
    not_in = sorted(r for r, s in states.items() if not s["in_collective"])
    if not waiting:
        return (
            "no rank is inside a collective: all ranks stopped progressing "
            f"(top frames: {_frames(states, list(states))})",
            stuck,
            not_in,
            None,
        )
    # Desync first (ranks disagree at one seq), then the lowest seq some member of the
    # group never entered: the collective everything else queues behind.
    for (pg, seq), by_rank in sorted(waiting.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        desync = _desync(pg, seq, by_rank)
        if desync is not None:
            return desync["verdict"], stuck, not_in, desync
    candidates = []
    for (pg, seq), by_rank in waiting.items():
        members = _members(by_rank, states)
        absent = sorted(r for r in members if r not in by_rank)
        candidates.append((not absent, seq, pg, by_rank, absent))
    _, seq, pg, by_rank, absent = min(candidates, key=lambda c: c[:3])
    op = next(iter(by_rank.values())).get("op")
    if absent:
        verdict = (
            f"rank{'s' if len(absent) > 1 else ''} {_join(absent)} never entered {op} "
            f"seq {seq} (pg {pg}) that rank{'s' if len(by_rank) > 1 else ''} "
            f"{_join(sorted(by_rank))} {'are' if len(by_rank) > 1 else 'is'} waiting in; "
            f"{_frames(states, absent)}"
        )
    else:
        verdict = (
            f"all ranks are waiting in {op} seq {seq} (pg {pg}): a rank outside "
            "this node or the transport is stuck"
        )
    return verdict, stuck, not_in, None


def _members(by_rank: dict[int, dict], states: dict[int, dict[str, Any]]) -> list[int]:
    """The group's ranks seen by this watchdog (all of them when the group is unknown)."""
    ranks = next((c.get("pg_ranks") for c in by_rank.values() if c.get("pg_ranks")), None)
    return [r for r in states if ranks is None or r in ranks]


def _desync(pg: str, seq: int, by_rank: dict[int, dict]) -> dict[str, Any] | None:
    calls = {r: (c.get("op"), c.get("shape"), c.get("dtype")) for r, c in by_rank.items()}
    if len(set(map(str, calls.values()))) <= 1:
        return None
    described = "; ".join(
        f"rank {r}: {op} {shape} {dtype} at {by_rank[r].get('callsite') or '?'}"
        for r, (op, shape, dtype) in sorted(calls.items())
    )
    return {
        "pg_name": pg,
        "seq": seq,
        "calls": {str(r): by_rank[r] for r in sorted(by_rank)},
        "verdict": f"desync at seq {seq} (pg {pg}): ranks called different collectives: "
        f"{described}",
    }


def _frames(states: dict[int, dict[str, Any]], ranks: list[int]) -> str:
    return ", ".join(f"rank {r} is at {states[r]['top_frame'] or 'unknown'}" for r in ranks)


def _join(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks)
