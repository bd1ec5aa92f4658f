"""Which rank caused a failed run (launcher side, after the job ended).

A rank that dies without writing its status (SIGKILL from the OOM killer, a segfault, a
native abort) takes its peers down with it: their collectives raise "Connection reset
by peer" / "Connection closed by peer" and they write a failed status. Those errors are
consequences. The cause is found from, in this order of trust:

- the elastic agent's record of each worker's exit code or signal
  (``node<N>/agent_failures.json``, :mod:`gpudiag.capture.agent`), or the job's own
  return code when gpudiag started the single process itself;
- each rank's status.json (a Python exception and its traceback) and stacks.txt (a
  fatal signal's Python stack written by faulthandler);
- the order of events: when each rank last wrote a row, when the launcher saw it exit.
"""

from __future__ import annotations

import itertools
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag import frames, rundir
from gpudiag.capture.agent import AGENT_FAILURES, SPAWN_PARENT

SIGNAL_HINTS = {
    "SIGKILL": "the kernel's OOM killer (see `dmesg`) or a `kill -9`",
    "SIGSEGV": "a segmentation fault in native code",
    "SIGABRT": "a native abort (a failed check in c10, gloo or NCCL; see the rank's stderr)",
    "SIGBUS": "a bus error (often /dev/shm full, or a truncated memory-mapped file)",
    "SIGFPE": "a floating-point exception in native code",
    "SIGILL": "an illegal instruction (a binary built for another CPU)",
}
_FATAL_RE = re.compile(r"Fatal Python error: (?P<what>[^\n]+)")
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


is_peer_error = rundir.is_peer_error


@dataclass
class RankEnd:
    rank: int
    status: dict[str, Any] | None = None
    exitcode: int | None = None  # the agent's (or the job's) exit code; < 0: signal
    signal: str | None = None
    last_write_ns: int | None = None  # the rank's last written row or file
    gone_ns: int | None = None  # when the launcher saw its process gone
    last_step: int | None = None
    crash: str | None = None  # "Segmentation fault" from faulthandler's stacks
    crash_stacks: str | None = None
    notes: list[str] = field(default_factory=list)
    # a rank of another node that left no status while this node's ranks lost their
    # connection: how its node ended, as far as this launcher can tell
    lost: str | None = None
    last_call: dict[str, Any] | None = None  # the user collective it entered last
    # a later collective torch issued itself (DDP's gradient buckets inside backward, its
    # start-up sync), from the Flight Recorder's rows; read only after a collective timeout
    torch_call: dict[str, Any] | None = None
    # per process group: the highest seq this rank is known to have issued, and the
    # group's global ranks (its collectives tables; read only after a collective timeout)
    max_seq: dict[str, int] = field(default_factory=dict)
    pg_ranks: dict[str, list[int]] = field(default_factory=dict)
    # a rank that never reached the collective a peer timed out in: that peer's end,
    # and the call (op, pg_name, seq, callsite; None where not known)
    late_for: RankEnd | None = None
    late_call: dict[str, Any] = field(default_factory=dict)

    @property
    def entered(self) -> dict[str, Any] | None:
        """The collective this rank entered last: a user call, or one torch issued."""
        return self.torch_call or self.last_call

    @property
    def timed_out(self) -> bool:
        return self.failed and rundir.is_collective_timeout(self.status or {})

    @property
    def died_without_status(self) -> bool:
        return self.status is None and (
            self.signal is not None
            or (self.exitcode is not None and self.exitcode != 0)
            or self.crash is not None
        )

    @property
    def exited_zero(self) -> bool:
        """Ended with exit code 0: status ok, or no status while the elastic agent, which
        lists every worker that ended otherwise, did not list it (``os._exit(0)``)."""
        if isinstance(self.status, dict):
            return self.status.get("status") == "ok"
        return self.exitcode == 0 and self.signal is None and self.crash is None

    @property
    def failed(self) -> bool:
        return isinstance(self.status, dict) and self.status.get("status") == "failed"

    @property
    def interrupted(self) -> bool:
        """Ended by SIGTERM or SIGINT (status ``interrupted``)."""
        return isinstance(self.status, dict) and self.status.get("status") == "interrupted"

    @property
    def when_ns(self) -> int:
        """When this rank stopped: its status's end, else its last sign of life."""
        if isinstance(self.status, dict) and isinstance(self.status.get("end_ns"), int):
            return int(self.status["end_ns"])
        return int(self.last_write_ns or self.gone_ns or 0)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def agent_failures(run_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for node in [*rundir.list_nodes(run_dir), 0]:
        data = rundir.read_json(rundir.node_dir(run_dir, node) / AGENT_FAILURES)
        rows = data.get("failures") if isinstance(data, dict) else None
        for key, row in (rows or {}).items() if isinstance(rows, dict) else []:
            try:
                out[int(key)] = row if isinstance(row, dict) else {}
            except (TypeError, ValueError):
                continue
    return out


def _spawn_parent(run_dir: Path) -> bool:
    """The process gpudiag started handed its rank over to mp.spawn's workers."""
    return any(
        isinstance(data := rundir.read_json(rundir.node_dir(run_dir, n) / AGENT_FAILURES), dict)
        and data.get("by") == SPAWN_PARENT
        for n in [*rundir.list_nodes(run_dir), 0]
    )


def _last_write_ns(run_dir: Path, rank: int) -> int | None:
    rdir = rundir.rank_dir(run_dir, rank)
    stamps = []
    for table in rundir.RANK_TABLES:
        path = rundir.table_path(rdir, table)
        try:
            if path.stat().st_size:
                stamps.append(path.stat().st_mtime_ns)
        except OSError:
            continue
    return max(stamps) if stamps else None


def _last_step(run_dir: Path, rank: int) -> int | None:
    last = None
    path = rundir.table_path(rundir.rank_dir(run_dir, rank), rundir.STEPS)
    for row in rundir.iter_jsonl(path):
        if isinstance(row.get("step"), int):
            last = row["step"] if last is None else max(last, row["step"])
    return last


def _crash(run_dir: Path, rank: int) -> tuple[str | None, str | None]:
    """faulthandler's "Fatal Python error: X" block in stacks.txt, if the rank wrote one."""
    text = rundir.read_text(rundir.rank_dir(run_dir, rank) / rundir.STACKS)
    if text is None:
        return None, None
    matches = list(_FATAL_RE.finditer(text))
    if not matches:
        return None, None
    m = matches[-1]
    return m["what"].strip(), text[m.start() : m.start() + 8000]


def rank_ends(
    run_dir: Path,
    ranks: list[int],
    statuses: dict[int, dict[str, Any]],
    gone_ns: dict[int, int] | None = None,
    single_returncode: int | None = None,
) -> dict[int, RankEnd]:
    """Everything known about how each rank ended."""
    agent = agent_failures(run_dir)
    if _spawn_parent(run_dir):  # the process gpudiag started is no rank
        single_returncode = None
    # the one process gpudiag started: the only rank here (of a world of 1, or one rank
    # of a job whose other ranks were launched separately)
    here = rundir.list_ranks(run_dir) if single_returncode is not None else []
    info = rundir.read_json(rundir.rank_dir(run_dir, here[0]) / rundir.RANK_INFO) if here else None
    started_here = len(here) == 1 and isinstance(info, dict) and info.get("started_by") == "gpudiag"
    single = here[0] if started_here else ranks[0] if len(ranks) == 1 else None
    ends: dict[int, RankEnd] = {}
    for r in ranks:
        end = RankEnd(r, statuses.get(r))
        row = agent.get(r)
        if row is not None and isinstance(row.get("exitcode"), int):
            end.exitcode = row["exitcode"]
        elif single_returncode is not None and r == single:
            end.exitcode = single_returncode
        if end.exitcode is not None and end.exitcode < 0:
            end.signal = signal_name(-end.exitcode)
        end.crash, end.crash_stacks = _crash(run_dir, r)
        if end.signal is None and end.crash in _FATAL_SIGNALS and end.status is None:
            end.signal = _FATAL_SIGNALS[end.crash]
        end.last_write_ns = _last_write_ns(run_dir, r)
        end.gone_ns = (gone_ns or {}).get(r)
        end.last_step = _last_step(run_dir, r)
        end.last_call = rundir.read_last_call(run_dir, r)
        if (
            end.status is None
            and row is None
            and agent
            and end.gone_ns is not None
            and end.exitcode is None
            and end.crash is None
        ):
            # the agent wrote the workers that failed, and this one was not among them,
            # yet the launcher saw it gone without a status: it exited 0 (os._exit(0))
            end.exitcode = 0
            end.notes.append(
                "exit code 0: gone, without status, and not among the agent's failures"
            )
        ends[r] = end
    return ends


def mark_late_ranks(ends: dict[int, RankEnd]) -> None:
    """A rank timed out in a collective (the script's own ``timeout=`` or NCCL's
    watchdog): the peers that never reached that call (their last user collective of
    the same group came before it; in the default group, also a rank that never entered
    one) kept it waiting, and are the cause (``late_for``). Without the calls, nothing."""
    waiting = sorted((e for e in ends.values() if e.timed_out), key=lambda e: e.when_ns)
    if _mark_named_by_monitored_barrier(ends, waiting):
        return
    call = next((e.entered for e in waiting if _is_call(e.entered)), None)
    if call is None:
        return
    waiter = next(e for e in waiting if e.entered is call)
    pg = str(call.get("pg_name"))
    members = waiter.pg_ranks.get(pg)
    for end in ends.values():
        if end.timed_out or end.rank == waiter.rank:
            continue
        if members is not None and end.rank not in members:
            continue  # not in the group the waiter timed out in
        issued = end.max_seq.get(pg)
        if issued is not None:
            behind = issued < call["seq"]
        else:  # no call of that group: behind if it is known to be a member
            behind = members is not None or pg == DEFAULT_GROUP
        if behind:
            end.late_for, end.late_call = waiter, call
    for _ in range(len(ends)):
        if not _pass_lateness_on(ends):
            break


def _pass_lateness_on(ends: dict[int, RankEnd]) -> bool:
    """A late rank that was itself waiting in a call of another group (rank 1, late for
    rank 0 in group A, was in group B's call that rank 2 never reached): the rank behind
    in that call is the cause, the waiting one a consequence (ninth probe: a chain of
    three blamed the middle rank). True when the blame moved."""
    for late in [e for e in ends.values() if e.late_for is not None]:
        mine = late.entered
        if mine is None or not _is_call(mine) or late.failed:
            continue
        pg = str(mine.get("pg_name"))
        if pg == str(late.late_call.get("pg_name")):
            continue
        members = late.pg_ranks.get(pg)
        behind = [
            e
            for e in ends.values()
            if e.rank != late.rank
            and (members is None or e.rank in members)
            and (members is not None or pg == DEFAULT_GROUP)
            and e.max_seq.get(pg, -1) < mine["seq"]
            and e.late_for is None
        ]
        if behind:
            for e in behind:
                e.late_for, e.late_call = late, mine
            late.late_for, late.late_call = None, {}
            return True
    return False


def read_calls(run_dir: Path, end: RankEnd) -> None:
    """``end.max_seq`` and ``end.pg_ranks`` from the rank's collectives tables (the
    Flight Recorder's rows name each group's ranks) and its last call; ``end.torch_call``
    when the latest Flight Recorder row is a later call than the last user call."""
    rank_dir = rundir.rank_dir(run_dir, end.rank)
    rows: list[dict[str, Any]] = [end.last_call] if isinstance(end.last_call, dict) else []
    for table in (rundir.COLLECTIVES, rundir.COLLECTIVE_TIMES):
        path = rundir.table_path(rank_dir, table)
        rows = itertools.chain(rows, rundir.iter_jsonl(path))  # type: ignore[assignment]
    latest: dict[str, Any] | None = None  # the Flight Recorder's last-created call
    for row in rows:
        seq, pg = row.get("seq"), row.get("pg_name")
        if not isinstance(seq, int) or pg is None or row.get("op") == "lost":
            continue
        if row.get("source") == "flight_recorder" and _created(row) >= _created(latest):
            latest = row
        pg = str(pg)
        end.max_seq[pg] = max(end.max_seq.get(pg, seq), seq)
        ranks = row.get("pg_ranks")
        if (
            pg not in end.pg_ranks
            and isinstance(ranks, list)
            and all(isinstance(r, int) for r in ranks)
        ):
            end.pg_ranks[pg] = ranks
    if latest is not None and _later_than_last_call(latest, end.last_call):
        end.torch_call = _torch_call(latest, end)


def _created(row: dict[str, Any] | None) -> tuple[int, int]:
    """When a Flight Recorder row's call was issued (then its record id), for ordering."""
    if row is None:
        return (-1, -1)
    t_ns, rid = row.get("enqueue_ns"), row.get("record_id")
    return (t_ns if isinstance(t_ns, int) else 0, rid if isinstance(rid, int) else 0)


def _later_than_last_call(row: dict[str, Any], last: dict[str, Any] | None) -> bool:
    """A Flight Recorder row is a call after the rank's last user call: a higher seq of
    the same group, or, in another group, issued after the user call was entered. The
    user call's own row (same group and seq) is not: the last call names its line."""
    if not _is_call(last):
        return True
    assert last is not None
    if str(row.get("pg_name")) == str(last.get("pg_name")):
        return bool(row["seq"] > last["seq"])
    entered = last.get("enter_ns")
    return isinstance(entered, int) and _created(row)[0] > entered


def _torch_call(row: dict[str, Any], end: RankEnd) -> dict[str, Any]:
    """A call torch issued (no user line of its own): where the script was when it was
    issued is the rank's own line, when the rank failed in it (its traceback)."""
    status = end.status or {}
    where = frames.user_frame(str(status.get("traceback") or "")) if end.timed_out else None
    return {
        "op": row.get("op"),
        "pg_name": str(row.get("pg_name")),
        "seq": row["seq"],
        "callsite": where,
        "issued_by": "torch",
    }


# torch's monitored_barrier names the ranks that did not arrive ("[Rank 0]: Rank 1 failed
# to pass monitoredBarrier in 5000 ms"; "Ranks 1, 2" with wait_all_ranks=True)
_MONITORED_RE = re.compile(r"Ranks? ([\d, ]+?) failed to pass monitoredBarrier", re.IGNORECASE)


def _mark_named_by_monitored_barrier(ends: dict[int, RankEnd], waiting: list[RankEnd]) -> bool:
    """The ranks a timed-out monitored_barrier names are late for it; True when any."""
    for waiter in waiting:
        m = _MONITORED_RE.search(str((waiter.status or {}).get("message") or ""))
        if m is None:
            continue
        named = [int(x) for x in re.findall(r"\d+", m.group(1))]
        call = {
            "op": "monitored_barrier",
            "callsite": frames.user_frame(str((waiter.status or {}).get("traceback") or "")),
        }
        for r in named:
            if r in ends and r != waiter.rank and not ends[r].timed_out:
                ends[r].late_for, ends[r].late_call = waiter, call
        return any(ends[r].late_for is waiter for r in named if r in ends)
    return False


DEFAULT_GROUP = "0"  # torch's name for the default process group


def _is_call(call: dict[str, Any] | None) -> bool:
    return isinstance(call, dict) and isinstance(call.get("seq"), int) and "pg_name" in call


def late_failure(end: RankEnd, consequences: list[RankEnd]) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank that never reached the collective a peer
    timed out in (:func:`mark_late_ranks`)."""
    waiter = end.late_for
    assert waiter is not None
    call, status = end.late_call, end.status or {}
    where = frames.user_frame(str(status.get("traceback") or "")) or (
        f"after its last collective at {end.last_call.get('callsite')}"
        if isinstance(end.last_call, dict) and end.last_call.get("callsite")
        else None
    )
    step = f" in step {end.last_step + 1}" if end.last_step is not None else ""
    which = ", ".join(
        [
            *(
                f"{what} {call[key]}"
                for what, key in (("process group", "pg_name"), ("call", "seq"))
                if call.get(key) is not None
            ),
            *(["issued by torch, not the script"] if call.get("issued_by") == "torch" else []),
        ]
    )
    timed = waiter if waiter.timed_out else next((c for c in consequences if c.timed_out), None)
    timeout = str(((timed or waiter).status or {}).get("message") or "")[:160]
    message = (
        f"did not reach {call.get('op') or 'a collective'}{f' ({which})' if which else ''}"
        f"{_where_issued(call, waiter)} within its timeout{step}: "
        + (
            f"rank {waiter.rank} timed out waiting for it ({timeout})"
            if timed is waiter or timed is None
            else f"rank {waiter.rank} waited for it there, and so rank {timed.rank} timed "
            f"out waiting for rank {waiter.rank} ({timeout})"
        )
    )
    if where:
        message += f"; this rank was at {where} when the job ended"
    told = {waiter.rank, timed.rank if timed is not None else waiter.rank}
    others = sorted(c.rank for c in consequences if c.rank not in told and c.failed)
    if others:
        message += (
            f"; rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} then failed too"
        )
    return {
        "rank": end.rank,
        "exc_type": "late_to_collective",
        "message": message,
        "traceback": status.get("traceback") or end.crash_stacks,
        # the job's exit code stays the one the timed-out rank's error gave it
        "exit_code": ((timed or waiter).status or {}).get("exit_code"),
        "waiting_rank": waiter.rank,
        "collective": {
            **{k: call.get(k) for k in ("op", "pg_name", "seq", "callsite")},
            "issued_by": call.get("issued_by") or "script",
        },
    }


def _where_issued(call: dict[str, Any], waiter: RankEnd) -> str:
    """Where the call was made: the script's line, or, for a call torch issued itself
    (DDP's gradient buckets, its start-up sync), the waiting rank's line it was issued in."""
    where = call.get("callsite")
    if call.get("issued_by") != "torch":
        return f" at {where or '?'}"
    return f" at rank {waiter.rank}'s {where}" if where else ""


def find_cause(
    ends: dict[int, RankEnd], signalled_from_outside: bool = False
) -> tuple[int, list[int]] | None:
    """(the rank that caused the failure, the ranks whose failure followed from it).

    A rank that raised an error of its own comes first (earliest first); a rank that
    died without a status comes next, when the others only lost their connection to it
    (earliest last sign of life first); then, when ``signalled_from_outside`` (the job's
    launcher was sent no signal, so neither it nor the elastic agent's shutdown after a
    failure above sent it), a rank interrupted by a signal before any rank failed; then
    a rank that left the job with exit code 0 before any rank failed, when a peer then
    lost its connection (``sys.exit(0)``, ``os._exit(0)``, a return before a collective
    its peers are in: ``rundir.left_early``); peers' connection errors come last."""
    own = [
        e
        for e in ends.values()
        if e.failed and not is_peer_error(e.status or {}) and not e.timed_out
    ]
    died = [e for e in ends.values() if e.died_without_status]
    late = [e for e in ends.values() if e.late_for is not None]
    timed_out = [e for e in ends.values() if e.timed_out]
    # a rank interrupted after another rank had already failed (a peer error too) was
    # most likely ended by the elastic agent's shutdown of the failed job, not from outside
    # (seen on a loaded host: node 1's launcher killed, node 0's torchrun then ended rank 1)
    first_failure = min(
        (e.when_ns for e in ends.values() if e.failed or e.died_without_status), default=None
    )
    signalled = [
        e
        for e in ends.values()
        if signalled_from_outside
        and e.interrupted
        and (first_failure is None or e.when_ns <= first_failure)
    ]
    lost = [e for e in ends.values() if e.lost and e.status is None]
    peer = [e for e in ends.values() if e.failed and is_peer_error(e.status or {})]
    # not ``lost``: another node's rank that left no status is not known to have exited 0
    early = [
        e
        for e in ends.values()
        if peer and first_failure is not None and e.exited_zero and e.when_ns < first_failure
    ]
    for group in (own, died, late, timed_out, signalled, early, lost, peer):
        if group:
            cause = min(group, key=lambda e: (e.when_ns or 0, e.rank))
            others = [
                e.rank for e in sorted(ends.values(), key=lambda e: (e.when_ns or 0, e.rank))
                if e.rank != cause.rank and (e.failed or e.died_without_status or e.lost)
            ]  # fmt: skip
            return cause.rank, others
    return None


def _signal_name(status: dict[str, Any]) -> str:
    """The signal that ended an interrupted rank: from its exception (a script's own
    handler exits with a code of its own), else from its exit code."""
    exc_type = status.get("exc_type")
    if exc_type == "KeyboardInterrupt":
        return "SIGINT"
    if isinstance(exc_type, str) and exc_type.startswith("SIG"):
        return exc_type
    return "SIGINT" if status.get("exit_code") == 130 else "SIGTERM"


def signalled_failure(
    end: RankEnd, consequences: list[RankEnd], node_lost: str | None = None
) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank ended by a signal nobody in the job sent
    (``node_lost``: how its node ended, when that node's launcher is known to be gone)."""
    status = end.status or {}
    how = _signal_name(status)
    step = f" during step {end.last_step + 1}" if end.last_step is not None else ""
    if node_lost and "was lost" in node_lost:
        message = f"was ended by {how}{step}: {node_lost}, and its ranks with it"
    elif node_lost and "launcher received" in node_lost:
        message = f"was ended by {how}{step}: {node_lost} (a Ctrl-C or `kill` on that node)"
    elif how == "SIGINT":
        # a KeyboardInterrupt the script raised itself ends a rank the same way
        message = (
            f"was ended by a KeyboardInterrupt{step} that neither gpudiag, torchrun nor a "
            "failing peer sent (SIGINT from outside the job: a `kill -INT`? or raised by "
            "the script itself)"
        )
    else:
        message = (
            f"was ended by {how} from outside the job{step} (neither gpudiag, torchrun nor "
            "a failing peer sent it: a scheduler preemption, an OOM guard, a `kill`?)"
        )
    peers = [c for c in consequences if c.failed]
    if peers:
        message += (
            f"; rank{'s' if len(peers) > 1 else ''} {', '.join(str(c.rank) for c in peers)} "
            "then lost the connection to it (a consequence, not the cause)"
        )
    return {
        "rank": end.rank,
        "exc_type": how,
        "message": message,
        "traceback": status.get("traceback"),
        "exit_code": status.get("exit_code"),
        "signal": how,
        "last_step": end.last_step,
    }


def early_exit_failure(end: RankEnd, consequences: list[RankEnd]) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank that left the job with exit code 0 while
    its peers were still in it (:func:`find_cause`'s ``early``)."""
    status = end.status or {}
    steps = status.get("steps_completed")
    if not isinstance(steps, int):
        steps = end.last_step + 1 if end.last_step is not None else None
    return rundir.early_exit_failure(
        end.rank,
        [c.rank for c in consequences if c.failed],
        steps,
        end.when_ns or None,
        without_status=end.status is None,
    )


def _aborted_in_collective(stacks: str | None) -> bool:
    """faulthandler's stack of the abort has a thread inside torch.distributed."""
    from gpudiag.capture.watchdog import FRAME_RE

    for line in (stacks or "").splitlines():
        m = FRAME_RE.match(line)
        if m and frames.in_module(m["file"], "torch.distributed"):
            return True
    return False


def died_failure(end: RankEnd, consequences: list[RankEnd]) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank that died without writing its status."""
    from gpudiag.capture.watchdog import top_user_frame

    how = end.signal or (f"exit code {end.exitcode}" if end.exitcode is not None else "unknown")
    step = (
        f"during step {end.last_step + 1} (after step {end.last_step} was recorded)"
        if end.last_step is not None
        else "with no step of it recorded here"
        if end.lost
        else "before its first step"
    )
    hint = SIGNAL_HINTS.get(end.signal or "")
    message = f"died from {how} {step} without writing its status"
    if end.lost and end.signal is None and end.exitcode is None:
        message = f"stopped {step} without writing its status: {end.lost}"
    in_collective = end.signal == "SIGABRT" and _aborted_in_collective(end.crash_stacks)
    if in_collective:
        # gloo aborts the rank that *received* the odd data, not the one that sent it
        message += (
            ": aborted by gloo inside a collective, which is what a collective mismatch "
            "does (a rank that skipped a call or passed another size); that rank may be "
            "another one: `gpudiag analyze` compares the calls and names it"
        )
    elif hint:
        message += f": {hint}"
    peers = [c for c in consequences if c.failed]
    ended = [c for c in consequences if c.interrupted and not c.failed]
    if ended and in_collective:
        # the rank that diverged may be among them: not called a consequence (probe 28c)
        message += (
            f"; rank{'s' if len(ended) > 1 else ''} {', '.join(str(c.rank) for c in ended)} "
            "then ended by the job's shutdown"
        )
    elif ended:
        message += (
            f"; rank{'s' if len(ended) > 1 else ''} {', '.join(str(c.rank) for c in ended)} "
            "then ended by the job's shutdown (a consequence, not the cause)"
        )
    if peers and in_collective:
        message += f"; rank{'s' if len(peers) > 1 else ''} {', '.join(str(c.rank) for c in peers)} then lost the connection"
    elif peers:
        message += (
            f"; rank{'s' if len(peers) > 1 else ''} {', '.join(str(c.rank) for c in peers)} "
            "then lost the connection to it (a consequence, not the cause)"
        )
    code = 128 - end.exitcode if end.exitcode is not None and end.exitcode < 0 else end.exitcode
    return {
        "rank": end.rank,
        "exc_type": end.signal or ("node_lost" if end.lost else "died"),
        "message": message,
        "traceback": end.crash_stacks,
        "exit_code": code,
        "signal": end.signal,
        "last_step": end.last_step,
        "location": top_user_frame(end.crash_stacks or ""),
    }


def consequence_rows(consequences: list[RankEnd]) -> list[dict[str, Any]]:
    rows = []
    for c in consequences:
        status = c.status or {}
        rows.append(
            {
                "rank": c.rank,
                "status": status.get("status")
                or ("died" if c.died_without_status else "lost" if c.lost else None),
                "exc_type": status.get("exc_type") or c.signal,
                "message": str(status.get("message") or "")[:300] or None,
            }
        )
    return rows
