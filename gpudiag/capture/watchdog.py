"""Launcher-side hang watchdog.

Progress is the size/mtime of each local rank's step and collective tables (and its
rank_info). The watchdog is armed from the start: a job stuck in its first collective or
in the rendezvous is caught too. When nothing has progressed for ``timeout_s`` it asks
every local rank for a dump (a real-time signal: Python stacks; a request file: in-flight
collectives, see :mod:`gpudiag.capture.hangdump`), waits for the answers, and classifies
each rank:

- ``waiting``: inside a collective (gpudiag's record or the Flight Recorder) or blocked
  in ``torch.distributed`` (rendezvous, DDP's start-up broadcast);
- ``working``: not waiting and using CPU or doing I/O since the last check (evaluation,
  checkpointing, a slow start-up, a long step), its subprocesses' included (a rank that
  runs an upload tool through ``subprocess.run`` sits in ``wait`` while the tool works);
- ``idle``: neither (asleep, blocked on something else); ``gone``: the process exited.

It is a hang only when some rank waits and no other rank works: ranks running Python are
never ended. When unsure it says so once, keeps the stacks, and checks again after
another ``timeout_s``. On a hang it writes ``hang_report.json``. It ends the job (asks
every rank to flush and exit: a finish request, answered by the rank's poller thread even
while its main thread is blocked in C++; then ``on_hang(report)``, and the launcher kills
only the ranks that did not finish) when nothing but the hang can explain it (``--on-hang
auto``: every rank of the job is on this host and waits in a collective or is gone, not
all inside the same one: that is also what a long, healthy transfer looks like), or
always (``end``). A rank idle outside a collective (asleep, blocked on a lock, a queue, a
download) may be waiting on purpose, and another node's ranks are not seen from here:
then the job goes on (torchrun would let it: torch's own timeout ends a real hang), and
the report is removed again if progress resumes.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag import frames, rundir
from gpudiag.capture import proctree, threads
from gpudiag.capture.hangdump import finish_request_path, request_path

POLL_S = 0.5
# How long to wait for every rank's stacks and in-flight collectives. The answers come
# in well under a second on an idle machine; on a loaded one a rank may not be scheduled
# for seconds, and a report built without them blames the wrong line.
DUMP_WAIT_S = 30.0
# A rank that used this share of one core (or moved IO_WORKING_BYTES) since the last
# check is working. An idle gpudiag worker uses < 0.1 % (its poller thread).
CPU_WORKING_SHARE = 0.03
ACTIVITY_WINDOW_S = 3.0  # what a rank did in the last seconds decides if it works
CPU_WORKING_MIN_S = 0.05
IO_WORKING_BYTES = 1 << 20
_PROGRESS_TABLES = (rundir.STEPS, rundir.COLLECTIVES, rundir.COLLECTIVE_TIMES, rundir.DDP_STATS)
FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_DECORATOR_FUNCS = frozenset(("wrapper", "wrapped", "inner", "_fn", "decorator"))

WAITING, WORKING, IDLE, GONE = "waiting", "working", "idle", "gone"


@dataclass
class Usage:
    """CPU seconds and I/O bytes of one process, sampled at ``t``; with
    :func:`sample_usage`'s ``descendants``, of its whole tree (``subprocesses``: how many
    descendants were alive, ``running``: how many of them were on a CPU or runnable)."""

    t: float
    cpu_s: float
    io_bytes: int
    alive: bool = True
    subprocesses: int = 0
    running: int = 0
    # stopped by a signal (SIGSTOP, SIGTSTP) or a tracer (a debugger): it cannot answer
    stopped: bool = False


def sample_usage(
    pid: int, descendants: bool = False, exclude: frozenset[int] = frozenset()
) -> Usage:
    """The process's CPU (its own, and that of the children it waited for) and I/O.
    With ``descendants``, its live children's, grandchildren's... are added (those in
    ``exclude``, other ranks re-executed as its children, and their trees are not): a
    rank whose work runs in a subprocess (a checkpoint upload tool through
    ``subprocess.run``) is working although its own process sleeps in ``wait``. A child
    that ends and is waited for moves its CPU into its parent's children's time, so the
    sum does not drop when it does."""
    now = time.monotonic()
    try:
        import psutil

        proc = psutil.Process(pid)
        status = proc.status()
        if status == psutil.STATUS_ZOMBIE:
            return Usage(now, 0.0, 0, alive=False)
        cpu_s, io_bytes = _process_usage(proc)
        stopped = status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        usage = Usage(now, cpu_s, io_bytes, stopped=stopped)
    except Exception:  # noqa: BLE001 - gone, or psutil missing: judged by pid only
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return Usage(now, 0.0, 0, alive=False)
        return Usage(now, float("nan"), 0)
    if descendants:
        _add_descendants(usage, pid, exclude)
    return usage


def _process_usage(proc: Any) -> tuple[float, int]:
    import psutil

    cpu = proc.cpu_times()
    cpu_s = float(cpu.user + cpu.system)
    cpu_s += float(getattr(cpu, "children_user", 0.0) + getattr(cpu, "children_system", 0.0))
    try:
        io = proc.io_counters()
        io_bytes = int(getattr(io, "read_chars", io.read_bytes)) + int(
            getattr(io, "write_chars", io.write_bytes)
        )
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        io_bytes = 0
    return cpu_s, io_bytes


def _add_descendants(usage: Usage, pid: int, exclude: frozenset[int]) -> None:
    import psutil

    try:
        pids = proctree.descendants(pid)  # /proc/<pid>/task/*/children: a few small reads
    except Exception:  # noqa: BLE001 - no such files: psutil scans every process
        try:
            pids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except Exception:  # noqa: BLE001
            return
    skipped: set[int] = set()
    for child in pids:
        if child in exclude:
            skipped.add(child)
            continue
        try:
            proc = psutil.Process(child)
            if proc.ppid() in skipped:  # the tree of an excluded process
                skipped.add(child)
                continue
            status = proc.status()
            cpu_s, io_bytes = _process_usage(proc)
        except Exception:  # noqa: BLE001 - ended meanwhile
            continue
        usage.cpu_s += cpu_s
        usage.io_bytes += io_bytes
        usage.subprocesses += 1
        usage.running += status == psutil.STATUS_RUNNING


def activity(before: Usage | None, after: Usage) -> str:
    """working / idle / gone for a rank that is not waiting in a collective."""
    if not after.alive:
        return GONE
    if before is None or after.cpu_s != after.cpu_s:  # new process, or unknown: assume work
        return WORKING
    if after.running:  # a subprocess of the rank is on a CPU now
        return WORKING
    window = max(after.t - before.t, 1e-3)
    cpu = after.cpu_s - before.cpu_s
    if cpu >= max(CPU_WORKING_MIN_S, CPU_WORKING_SHARE * window):
        return WORKING
    if after.io_bytes - before.io_bytes >= IO_WORKING_BYTES:
        return WORKING
    return IDLE


class HangWatchdog:
    """Background thread that fires once when ranks wait in a collective (or the
    rendezvous) and nothing progresses for timeout_s while no other rank works."""

    def __init__(
        self,
        run_dir: Path,
        timeout_s: float,
        on_hang: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float | None = None,
        on_notice: Callable[[str], None] | None = None,
        dump_wait_s: float = DUMP_WAIT_S,
        finish_ranks: bool = True,
        expected_local_ranks: int | None = None,
        node: int | None = None,
        on_hang_mode: str = "end",
        ending: Callable[[], bool] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        # the launcher is ending the job (a signal it forwarded): the ranks' last writes
        # are no progress, and a suspected hang's report stays
        self.ending = ending or (lambda: False)
        self.on_hang_mode = on_hang_mode
        self.suspected: dict[str, Any] | None = None  # a hang reported, the job left running
        self.node = node
        self.timeout_s = float(timeout_s)
        self.on_hang = on_hang
        self.on_notice = on_notice
        self.poll_s = poll_s if poll_s is not None else poll_interval(self.timeout_s)
        self.dump_wait_s = dump_wait_s
        self.finish_ranks = finish_ranks
        self.expected_local_ranks = expected_local_ranks
        self.fired = False
        self.report: dict[str, Any] | None = None
        self.checks: list[dict[str, Any]] = []  # every check that did not fire
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_signature: tuple = ()
        self._last_progress = time.monotonic()
        self._baseline: dict[int, Usage] = {}
        self._pids: dict[int, int] = {}
        self._samples: list[tuple[float, dict[int, Usage]]] = []  # the last few seconds
        self._stacks: dict[int, str] = {}  # each rank's stack at the last check

    def start(self) -> None:
        self._last_progress = time.monotonic()
        self._thread = threads.start(self._run, "gpudiag-watchdog")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        last_check = time.monotonic()
        noticed = False
        baseline_due = False
        while not self._stop.wait(self.poll_s):
            signature = progress_signature(self.run_dir)
            now = time.monotonic()
            if signature != self._last_signature:
                # Progress. The ranks' usage is read at the first quiet poll after it, not
                # at every poll of a healthy job (rank_info and psutil per rank, twice a
                # second, on the ranks' cores).
                self._last_signature = signature
                self._last_progress = last_check = now
                self._stacks = {}  # stacks compare within one quiet period only
                noticed = False
                if self.suspected is not None and not self.ending():
                    self._progress_resumed()
                baseline_due = True
                continue
            if baseline_due:
                baseline_due = False
                self._pids = _local_ranks(self.run_dir, self.node)
                self._baseline = _usage(self._pids)
                self._samples = [(now, self._baseline)]
            else:
                self._sample(now)
            if now - last_check < self.timeout_s:
                continue
            try:
                report = self._check(now - self._last_progress)
            except Exception as exc:  # noqa: BLE001 - a watchdog bug must not end watching
                report = None
                if self.on_notice is not None:
                    self.on_notice(f"hang check failed ({type(exc).__name__}: {exc})")
            last_check = time.monotonic()
            if report is None or self._stop.is_set():
                continue
            if report["hang"] and self._ends_the_job(report):
                self._fire(report)
                return
            if report["hang"]:
                self._suspect(report)
                continue
            self.checks.append(report)
            if not noticed and report["stuck_ranks"] and self.on_notice is not None:
                self.on_notice(report["verdict"])
                noticed = True

    def _check(self, idle_s: float) -> dict[str, Any] | None:
        ranks = _local_ranks(self.run_dir, self.node)
        if not ranks:
            return None  # nothing started yet (imports): the agent's timeouts cover it
        usage = _usage(ranks)
        offsets = {r: _stacks_size(self.run_dir, r) for r in ranks}
        requested_ns = time.time_ns()
        # a stopped rank cannot answer: neither asked nor waited for (30 s per check)
        alive = [r for r in ranks if usage[r].alive and not usage[r].stopped]
        for rank in alive:
            request_dump(self.run_dir, rank, ranks[rank])
        _wait_for_dumps(self.run_dir, alive, requested_ns, offsets, ranks, self.dump_wait_s)
        report = build_hang_report(
            self.run_dir,
            idle_s,
            sorted(ranks),
            requested_ns,
            offsets=offsets,
            activities={r: activity(self._recent(r), usage[r]) for r in ranks},
            starting=max(0, (self.expected_local_ranks or 0) - len(ranks)),
            previous_stacks=self._stacks,
            subprocesses={r: usage[r].subprocesses for r in ranks},
            stopped={r for r in ranks if usage[r].stopped},
        )
        self._baseline = usage
        self._stacks = {int(r): st.pop("stack", "") for r, st in report["ranks"].items()}
        return report

    def _sample(self, now: float) -> None:
        """CPU and I/O of every known rank, kept for ACTIVITY_WINDOW_S: a rank is judged
        on what it did lately, not since the last progress (it may have worked, then
        stopped)."""
        self._samples.append((now, _usage(self._pids)))
        while len(self._samples) > 2 and self._samples[1][0] <= now - ACTIVITY_WINDOW_S:
            self._samples.pop(0)

    def _recent(self, rank: int) -> Usage | None:
        """The rank's usage about ACTIVITY_WINDOW_S ago (else its baseline)."""
        cutoff = time.monotonic() - min(ACTIVITY_WINDOW_S, self.timeout_s) + self.poll_s
        best = None
        for t, usage in self._samples:
            if t > cutoff:
                break
            best = usage.get(rank, best)
        return best or self._baseline.get(rank)

    def _ends_the_job(self, report: dict[str, Any]) -> bool:
        return self.on_hang_mode == "end" or (
            self.on_hang_mode == "auto" and not self._why_not_ended(report)
        )

    def _why_not_ended(self, report: dict[str, Any]) -> str:
        """Why `--on-hang auto` leaves this hang's job running ("" when it ends it)."""
        states = report["ranks"]
        idle = sorted(int(r) for r, st in states.items() if st["activity"] not in (WAITING, GONE))
        stopped = sorted(int(r) for r, st in states.items() if st.get("stopped"))
        if stopped:
            return f"rank(s) {_join(stopped)} stopped (Ctrl-Z, a debugger)"
        if idle:
            return (
                f"rank{'s' if len(idle) > 1 else ''} {_join(idle)} idle outside a collective "
                "(asleep, or blocked on a lock, a queue or I/O: it may be on purpose)"
            )
        world = _world_size(self.run_dir, [int(r) for r in states])
        if world is None or world > len(states):
            return "ranks of other hosts or nodes are not watched from here"
        shared = _one_shared_call(states)
        if shared and report.get("desync") is None:
            return (
                f"every rank is inside the same collective ({shared}): a long transfer "
                "looks the same"
            )
        return ""

    def _suspect(self, report: dict[str, Any]) -> None:
        """A hang this mode leaves running: reported once, the job goes on."""
        if self.suspected is not None:
            return
        why = self._why_not_ended(report) if self.on_hang_mode == "auto" else "--on-hang report"
        report["ended"] = False
        report["not_ended_because"] = why
        self.suspected = report
        self._write_report(report)
        if self.on_notice is not None:
            self.on_notice(
                f"hang suspected: {report['verdict']}; the job is not ended ({why}): "
                "torch's own timeout ends a real hang, `--on-hang end` would end it now"
            )

    def _progress_resumed(self) -> None:
        """Progress after a suspected hang: it was none; its report goes."""
        self.suspected = None
        try:
            rundir.hang_report_path(self.run_dir, self.node or 0).unlink(missing_ok=True)
        except OSError:
            pass
        if self.on_notice is not None:
            self.on_notice("progress resumed: not a hang (hang_report.json removed)")

    def settle(self) -> None:
        """At the job's end: a suspected hang of a job whose local ranks all ended ok was
        none (progress resumed after the last poll)."""
        if self.suspected is None:
            return
        ranks = _local_ranks(self.run_dir, self.node)
        statuses = [
            rundir.read_json(rundir.rank_dir(self.run_dir, r) / rundir.STATUS) for r in ranks
        ]
        if ranks and all(isinstance(st, dict) and st.get("status") == "ok" for st in statuses):
            self._progress_resumed()

    def _write_report(self, report: dict[str, Any]) -> None:
        path = rundir.hang_report_path(self.run_dir, self.node or 0)
        try:  # a full disk must not stop the hang from being handled
            rundir.write_json_atomic(path, report)
        except OSError as exc:
            rundir.note_write_problem(path, exc)

    def _fire(self, report: dict[str, Any]) -> None:
        self.fired = True
        self.report = report
        self._write_report(report)
        if self.finish_ranks:
            for rank in _local_ranks(self.run_dir, self.node):
                request_finish(self.run_dir, rank, report["verdict"])
        if self.on_hang is not None:
            self.on_hang(report)


def _one_shared_call(states: dict[str, dict[str, Any]]) -> str:
    """``op seq N (pg P)`` of a collective every rank is inside (no rank gone), else "":
    all ranks in one call is a stuck transport or a slow, healthy transfer (a large
    broadcast on a loaded host; probe 28g, N2), which the ranks' states cannot tell
    apart."""
    calls: list[set[tuple[str, int, str]]] = []
    for state in states.values():
        if state["activity"] != WAITING:
            return ""
        inflight = [c for c in state.get("inflight") or [] if isinstance(c, dict)]
        calls.append(
            {(str(c.get("pg_name")), int(c.get("seq") or -1), str(c.get("op"))) for c in inflight}
        )
    common = set.intersection(*calls) if calls else set()
    if not common:
        return ""
    pg, seq, op = min(common)
    return f"{op} seq {seq} (pg {pg})"


def _world_size(run_dir: Path, ranks: list[int]) -> int | None:
    """The job's world size as the ranks' rank_info says (None when none says)."""
    sizes = []
    for rank in ranks:
        info = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.RANK_INFO)
        if isinstance(info, dict) and isinstance(info.get("world_size"), int):
            sizes.append(info["world_size"])
    return max(sizes) if sizes else None


def _usage(ranks: dict[int, int]) -> dict[int, Usage]:
    """Each rank's usage with its subprocesses' (other ranks excluded)."""
    others = frozenset(ranks.values())
    return {r: sample_usage(pid, descendants=True, exclude=others) for r, pid in ranks.items()}


def poll_interval(timeout_s: float) -> float:
    """POLL_S for short timeouts, up to 1 s for long ones (a twentieth of the timeout):
    each poll reads the ranks' tables' sizes, and the default timeout is 300 s."""
    return min(max(POLL_S, timeout_s / 20), 1.0)


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


def _local_ranks(run_dir: Path, node: int | None = None) -> dict[int, int]:
    """rank -> pid for the ranks whose rank_info names this host (or no host) and, when
    ``node`` is given, this node rank (two nodes of one job may share a host and a run
    directory: each launcher watches only its own ranks)."""
    host = socket.gethostname()
    out = {}
    for rank in rundir.list_ranks(run_dir):
        info = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.RANK_INFO)
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            continue
        if (info.get("hostname") or info.get("host")) not in (None, host):
            continue
        node_rank = info.get("node_rank")
        if node is not None and isinstance(node_rank, int) and node_rank != node:
            continue
        out[rank] = info["pid"]
    return out


def request_dump(run_dir: Path, rank: int, pid: int) -> None:
    """Ask one worker for its in-flight collectives (file) and Python stacks
    (hangdump.STACK_DUMP_SIGNAL)."""
    from gpudiag.capture.hangdump import STACK_DUMP_SIGNAL

    path = request_path(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(time.time_ns()), encoding="utf-8")
    except OSError as exc:  # full disk: the stacks (the signal) may still come
        rundir.note_write_problem(path, exc)
    if STACK_DUMP_SIGNAL is None:
        return
    try:
        os.kill(pid, STACK_DUMP_SIGNAL)
    except (ProcessLookupError, PermissionError):
        pass


def request_finish(run_dir: Path, rank: int, reason: str) -> None:
    """Ask one worker to write its tables and status and exit (see hangdump)."""
    try:
        rundir.write_json_atomic(finish_request_path(run_dir, rank), reason)
    except OSError:
        pass


def _stacks_size(run_dir: Path, rank: int) -> int:
    try:
        return (rundir.rank_dir(run_dir, rank) / rundir.STACKS).stat().st_size
    except OSError:
        return 0


def _wait_for_dumps(
    run_dir: Path,
    ranks: list[int],
    requested_ns: int,
    offsets: dict[int, int] | None = None,
    pids: dict[int, int] | None = None,
    wait_s: float = DUMP_WAIT_S,
) -> None:
    """Until every rank wrote both answers (stacks grew, inflight.json is fresh), or
    exited, or wait_s passed."""
    deadline = time.monotonic() + wait_s
    pending = list(ranks)
    while pending and time.monotonic() < deadline:
        pending = [
            r
            for r in pending
            if not (
                _inflight_fresh(run_dir, r, requested_ns)
                and (offsets is None or _stacks_size(run_dir, r) > offsets.get(r, 0))
            )
            and (pids is None or sample_usage(pids[r]).alive)
        ]
        if pending:
            time.sleep(0.1)
    if offsets is not None:
        # faulthandler writes in the signal handler, a few hundred bytes at a time:
        # give a dump that is still being written a moment to end
        time.sleep(0.2)


def _inflight_fresh(run_dir: Path, rank: int, requested_ns: int) -> bool:
    data = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.INFLIGHT)
    return isinstance(data, dict) and int(data.get("t_ns") or 0) >= requested_ns


# --------------------------------------------------------------------------- report


def top_user_frame(stacks: str) -> str | None:
    """Innermost user frame (:func:`gpudiag.frames.is_user_file`) of the thread that was
    running when dumped (the main thread in faulthandler's "Current thread" block, else
    the first block)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip())
    current = [b for b in blocks if b.startswith("Current thread")]
    for block in current + [b for b in blocks if b not in current]:
        for line in block.splitlines():
            m = FRAME_RE.match(line)
            if m and frames.is_user_file(m["file"]):
                return f"{m['file']}:{m['line']} in {m['func']}"
    return None


def _last_step(run_dir: Path, rank: int, fallback: int | None) -> int | None:
    last = fallback
    for row in rundir.iter_jsonl(rundir.table_path(rundir.rank_dir(run_dir, rank), rundir.STEPS)):
        if isinstance(row.get("step"), int):
            last = row["step"] if last is None else max(last, row["step"])
    return last


def _read_stacks(run_dir: Path, rank: int, offset: int | None) -> str:
    """The stacks dumped for this request (the file keeps every dump of the run)."""
    path = rundir.rank_dir(run_dir, rank) / rundir.STACKS
    try:
        with open(path, "rb") as fh:
            fh.seek(offset or 0)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def current_block(stacks: str) -> str:
    """The dumped thread's stack (faulthandler's "Current thread" block: the main
    thread, which takes the dump signal) of the last dump in ``stacks``."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip())
    current = [b for b in blocks if b.startswith("Current thread")] or blocks[-1:]
    return current[-1] if current else ""


def in_torch_distributed(stacks: str) -> bool:
    """The dumped thread's innermost frame is in torch.distributed: blocked in a
    collective, the rendezvous or DDP's start-up broadcast (not importing it)."""
    block = current_block(stacks)
    if "<frozen importlib._bootstrap>" in block:
        return False
    for line in block.splitlines():
        m = FRAME_RE.match(line)
        if m:
            return frames.in_module(m["file"], "torch.distributed") and not frames.in_module(
                m["file"], "torch.distributed.elastic"
            )
    return False


def distributed_call(stacks: str) -> str | None:
    """The torch.distributed function the dumped thread entered (its outermost frame
    there), e.g. init_process_group, barrier, _sync_module_states."""
    found = None
    for line in current_block(stacks).splitlines():  # innermost first
        m = FRAME_RE.match(line)
        if m and frames.in_module(m["file"], "torch.distributed"):
            if m["func"] not in _DECORATOR_FUNCS:
                found = m["func"]
        elif m and found:
            break
    return found


def _rank_state(
    run_dir: Path,
    rank: int,
    requested_ns: int,
    offset: int | None = None,
    activity_: str | None = None,
    stale_before_ns: int = 0,
    previous_stack: str | None = None,
) -> dict[str, Any]:
    rdir = rundir.rank_dir(run_dir, rank)
    dump = rundir.read_json(rdir / rundir.INFLIGHT) or {}
    if int(dump.get("t_ns") or 0) < requested_ns:
        dump = {}  # no answer to this request (a blocked GIL, or a dead rank)
    stacks = _read_stacks(run_dir, rank, offset)
    inflight = _merge_inflight(dump.get("inflight") or [], dump.get("fr_unfinished") or [])
    blocked = in_torch_distributed(stacks)
    state = activity_ or WORKING
    stack = current_block(stacks)
    if state == IDLE and stack and previous_stack and stack != previous_stack:
        state = WORKING  # it moved since the last dump: running, however slowly
    # Waiting: in a collective entered before the quiet period began (a healthy one
    # does not last that long, whatever the CPU does: NCCL waits may spin), or blocked
    # in torch.distributed without working (rendezvous, DDP's start-up broadcast).
    old = any((c.get("enter_ns") or 0) <= stale_before_ns for c in inflight)
    if state != GONE and (old or ((inflight or blocked) and state != WORKING)):
        state = WAITING
    return {
        "rank": rank,
        "last_step": _last_step(run_dir, rank, dump.get("last_step")),
        "in_collective": state == WAITING,
        "inflight": inflight,
        "fr_unfinished": len(dump.get("fr_unfinished") or []),
        "top_frame": top_user_frame(stacks),
        "in_torch_distributed": blocked,
        "distributed_call": distributed_call(stacks) if blocked else None,
        "activity": state,
        "answered": bool(dump),
        "stacks_dumped": bool(stacks.strip()),
        "stack": stack,
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
    run_dir: Path,
    idle_s: float,
    ranks: list[int],
    requested_ns: int = 0,
    offsets: dict[int, int] | None = None,
    activities: dict[int, str] | None = None,
    starting: int = 0,
    previous_stacks: dict[int, str] | None = None,
    subprocesses: dict[int, int] | None = None,
    stopped: set[int] | None = None,
) -> dict[str, Any]:
    stale_before_ns = (requested_ns or time.time_ns()) - int(idle_s * 1e9)
    states = {
        r: _rank_state(
            run_dir,
            r,
            requested_ns,
            (offsets or {}).get(r),
            (activities or {}).get(r),
            stale_before_ns,
            (previous_stacks or {}).get(r),
        )
        for r in ranks
    }
    for r, n in (subprocesses or {}).items():
        if r in states:
            states[r]["subprocesses"] = n  # live descendants (their CPU counts as the rank's)
    for r in stopped or ():
        if r in states:
            states[r]["stopped"] = True
    hang, why = is_hang(states, starting)
    verdict, stuck, not_in, desync = hang_verdict(states)
    if not hang:
        verdict = f"not a hang: {why}"
    return {
        "detected_after_s": round(idle_s, 2),
        "t_ns": time.time_ns(),
        "hang": hang,
        "ranks": {str(r): s for r, s in states.items()},
        "stuck_ranks": stuck,
        "ranks_not_in_collective": not_in,
        "working_ranks": sorted(r for r, s in states.items() if s["activity"] == WORKING),
        "desync": desync,
        "verdict": verdict,
    }


def is_hang(states: dict[int, dict[str, Any]], starting: int = 0) -> tuple[bool, str]:
    """A hang: some rank waits in a collective (or the rendezvous) and no rank works
    (``starting``: local ranks that have not written rank_info yet, i.e. still start)."""
    if starting:
        return False, f"{starting} local rank(s) still starting (no rank_info.json yet); waiting"
    waiting = sorted(r for r, s in states.items() if s["activity"] == WAITING)
    working = sorted(r for r, s in states.items() if s["activity"] == WORKING)
    if not waiting:
        return False, (
            f"no rank is waiting in a collective (rank{'s' if len(states) > 1 else ''} "
            f"{_join(sorted(states))} running Python or idle; {_frames(states, list(states))}); "
            "waiting"
        )
    if working:
        return False, (
            f"rank{'s' if len(working) > 1 else ''} {_join(working)} still working "
            f"({_frames(states, working)}{_in_subprocesses(states, working)}) while rank{'s' if len(waiting) > 1 else ''} "
            f"{_join(waiting)} wait{'' if len(waiting) > 1 else 's'} in a collective; waiting"
        )
    return True, ""


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
        if stuck:
            calls = sorted({str(states[r].get("distributed_call") or "?") for r in stuck})
            who_not = (
                f" that rank{'s' if len(not_in) > 1 else ''} {_join(not_in)} never reached; "
                f"{_frames(states, not_in)}"
                if not_in
                else f"; {_frames(states, stuck)}"
            )
            return (
                f"rank{'s' if len(stuck) > 1 else ''} {_join(stuck)} blocked in "
                f"torch.distributed {'/'.join(calls)} (the rendezvous, or a collective "
                f"gpudiag did not record){who_not}",
                stuck,
                not_in,
                None,
            )
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
    cycle = _cross_group_cycle(waiting, states, (pg, seq), absent) if absent else None
    first = (op, pg, seq, sorted(by_rank))
    deeper = None if cycle is not None else _deeper_wait(waiting, states, (pg, seq), absent)
    if deeper is not None:  # the absent ranks wait themselves, for a rank further on
        (pg, seq), by_rank, absent = deeper
        op = next(iter(by_rank.values())).get("op")
    if cycle is not None:
        verdict = cycle
    elif absent:
        then = (
            f" (which keeps rank{'s' if len(first[3]) > 1 else ''} {_join(first[3])} "
            f"waiting in {first[0]} seq {first[2]} (pg {first[1]}))"
            if deeper is not None
            else ""
        )
        verdict = (
            f"rank{'s' if len(absent) > 1 else ''} {_join(absent)} never entered {op} "
            f"seq {seq} (pg {pg}) that rank{'s' if len(by_rank) > 1 else ''} "
            f"{_join(sorted(by_rank))} {'are' if len(by_rank) > 1 else 'is'} waiting in{then}; "
            f"{_frames(states, absent)}"
        )
    else:
        verdict = (
            f"all ranks are waiting in {op} seq {seq} (pg {pg}): a rank outside "
            "this node or the transport is stuck"
        )
    return verdict, stuck, not_in, None


def _deeper_wait(
    waiting: dict[tuple[str, int], dict[int, dict]],
    states: dict[int, dict[str, Any]],
    first: tuple[str, int],
    absent: list[int],
) -> tuple[tuple[str, int], dict[int, dict], list[int]] | None:
    """The end of a chain of waits: the ranks absent from ``first`` wait themselves in
    another call, from which further ranks are absent (rank 0 waits in group A for rank
    1, which waits in group B for rank 2, busy in its own code: ninth probe, F1b named
    rank 1). None when the absent ranks are not waiting elsewhere."""
    seen, found = {first}, None
    for _ in range(len(waiting)):
        nxt = next(
            (
                (key, theirs, missing)
                for key, theirs in waiting.items()
                if key not in seen
                and any(a in theirs for a in absent)
                and (missing := sorted(r for r in _members(theirs, states) if r not in theirs))
            ),
            None,
        )
        if nxt is None:
            return found
        seen.add(nxt[0])
        found, absent = nxt, nxt[2]
    return found


def _cross_group_cycle(
    waiting: dict[tuple[str, int], dict[int, dict]],
    states: dict[int, dict[str, Any]],
    first: tuple[str, int],
    absent: list[int],
) -> str | None:
    """Ranks that wait for each other in two process groups (rank 1 in group 1 for rank
    2, rank 2 in group 0 for rank 1): neither "never entered" alone is the cause, one of
    them made a call the other did not (eighth probe, F2: the waiting rank was named).
    The verdict names both, or None when there is no such cycle."""
    by_rank = waiting[first]
    for a in absent:
        for key, theirs in waiting.items():
            if key == first or a not in theirs:
                continue
            blockers = [r for r in _members(theirs, states) if r not in theirs and r in by_rank]
            if not blockers:
                continue
            b = blockers[0]
            op_a, op_b = theirs[a].get("op"), by_rank[b].get("op")
            return (
                f"deadlock across process groups: rank {a} waits in {op_a} seq {key[1]} "
                f"(pg {key[0]}) for rank {b}, and rank {b} waits in {op_b} seq {first[1]} "
                f"(pg {first[0]}) for rank {a}: one of them made a call of its group that "
                "the other did not (a call skipped, or one too many, on one branch); "
                f"{_frames(states, sorted({a, b}))}"
            )
    return None


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
    return ", ".join(_frame(r, states[r]) for r in ranks)


def _frame(rank: int, state: dict[str, Any]) -> str:
    if state.get("stopped"):
        # its stack cannot be dumped: a stopped process runs no handler
        return (
            f"rank {rank} is stopped (SIGSTOP, Ctrl-Z or a debugger: it runs nothing until "
            "continued)"
        )
    return f"rank {rank} is at {state['top_frame'] or 'unknown'}"


def _in_subprocesses(states: dict[int, dict[str, Any]], ranks: list[int]) -> str:
    parts = [
        f"rank {r} has {n} subprocess{'es' if n > 1 else ''}"
        for r in ranks
        if (n := states[r].get("subprocesses") or 0)
    ]
    return "; " + ", ".join(parts) if parts else ""


def _join(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks)
