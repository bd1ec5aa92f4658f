"""Worker side of the hang report (runs inside the training process).

- STACK_DUMP_SIGNAL (SIGRTMIN+4) makes :mod:`faulthandler` write every thread's Python stack to
  ``rank<R>/stacks.txt``. It runs in the signal handler at C level, so it works while
  the main thread is blocked inside a C++ collective.
- gpudiag's service thread (:class:`gpudiag.capture.threads.Service`) polls for the
  watchdog's request file; on a request it writes the
  collectives this rank entered and has not left, plus a fresh Flight Recorder dump of
  the unfinished entries, to ``rank<R>/inflight.json``.
- On a finish request (the watchdog decided the job hangs) the same poll ends the rank
  through the worker's finisher: tables, summary.json and status.json are written even
  though the main thread is blocked inside a C++ collective, where Python's SIGTERM
  handler cannot run. The launcher kills only the ranks that did not get that far.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gpudiag import rundir
from gpudiag.capture import threads

# The signal that makes faulthandler dump a rank's stacks: a real-time one, which scripts
# do not use. SIGUSR1, used before, is a script's to handle (a SLURM requeue handler
# replaced faulthandler's, and the dumps stopped) or to die of (a stray SIGUSR1 was
# swallowed: the job trained on where python and torchrun end it; sixth probe).
STACK_DUMP_SIGNAL: int | None = (
    signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGUSR1", None)
)

FINISH_REQUEST = "finish_request"  # "flush and end this rank": the job hangs
POLL_TASK = "gpudiag-hangdump"
POLL_S = 0.5  # requests come from the watchdog, which waits up to 30 s for answers
LIVE_EVERY_S = 1.0
# A rank without a step end for this long dumps its Flight Recorder once (per step) from
# the poll thread, so collectives the recorder's wrappers cannot see in flight (DDP's
# C++ bucket all-reduces) show in inflight_live.json as ``fr_pending``. Holds the GIL
# 28-42 ms for a full ring: at most once per step, only for steps longer than this.
LIVE_FR_IDLE_S = 5.0

_STACKS_FILE: IO[str] | None = None
_FINISHER: Callable[[str], None] | None = None
_STOP = threading.Event()


def request_path(run_dir: Path, rank: int) -> Path:
    return rundir.rank_dir(run_dir, rank) / rundir.HANG_REQUEST


def finish_request_path(run_dir: Path, rank: int) -> Path:
    return rundir.rank_dir(run_dir, rank) / FINISH_REQUEST


def hang_decided(run_dir: Path, rank: int) -> str | None:
    """The watchdog's verdict when it has decided that the job hangs (a node's watchdog
    writes its hang report, then a finish request per rank), else None. A rank whose collective
    fails right then failed because the watchdog ended its peer: it hangs, it did not fail.
    A report of a hang only suspected (``ended: false``: ``--on-hang report``, or ``auto``
    leaving a rank idle outside a collective be) decides nothing: the job was left running,
    and a SIGTERM that ends it then is the user's or the scheduler's (probe 28j, F5: each
    rank said "ended by gpudiag's hang watchdog ... SIGTERM from the agent")."""
    reports = [path for _, path in rundir.hang_report_paths(run_dir)]
    for path in (finish_request_path(run_dir, rank), *reports):
        decided = rundir.read_json(path)
        if isinstance(decided, dict):
            if decided.get("ended") is False:
                continue
            decided = decided.get("verdict")
        if isinstance(decided, str):
            return decided.strip() or "no progress"
        if path.exists():
            return "no progress"
    return None


def set_finisher(finisher: Callable[[str], None] | None) -> None:
    """What a finish request runs (in the service thread): the worker's flush-and-exit.
    Its argument is the request's text (the watchdog's verdict)."""
    global _FINISHER
    _FINISHER = finisher


def uninstall_hang_dump() -> None:
    """Stop answering requests (a process that hands its rank over, e.g. to the
    workers it spawns): faulthandler back to stderr, the poller stops."""
    global _STACKS_FILE
    _STOP.set()
    threads.service().remove(POLL_TASK, 0.0)
    if _STACKS_FILE is not None and STACK_DUMP_SIGNAL is not None:
        faulthandler.unregister(STACK_DUMP_SIGNAL)
        try:  # sys.stderr may be None or a stream without a descriptor: then none
            faulthandler.enable(file=sys.stderr, all_threads=True)
        except (AttributeError, OSError, RuntimeError, ValueError):
            faulthandler.disable()
        _STACKS_FILE.close()
        _STACKS_FILE = None


def dump_stacks_now() -> None:
    """Every thread's Python stack into the rank's stacks.txt (nothing when it is not
    open): where a finishing that never ends was stuck."""
    if _STACKS_FILE is None:
        return
    try:
        _STACKS_FILE.write("\n# gpudiag: finishing did not end in time; its threads:\n")
        _STACKS_FILE.flush()
        faulthandler.dump_traceback(file=_STACKS_FILE, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


def install_hang_dump(run_dir: Path, rank: int) -> None:
    """Arm the stack dump and start the request poller (idempotent per process)."""
    global _STACKS_FILE
    rdir = rundir.rank_dir(run_dir, rank)
    rdir.mkdir(parents=True, exist_ok=True)
    _STOP.clear()
    if _STACKS_FILE is None and STACK_DUMP_SIGNAL is not None:
        _STACKS_FILE = open(rdir / rundir.STACKS, "w", encoding="utf-8")  # noqa: SIM115
        if not _scripts_handler(STACK_DUMP_SIGNAL):
            faulthandler.register(
                STACK_DUMP_SIGNAL, file=_STACKS_FILE, all_threads=True, chain=False
            )
        # A C++ abort (e.g. gloo's size-mismatch check) then leaves the stacks too.
        faulthandler.enable(file=_STACKS_FILE, all_threads=True)
    threads.service().add(POLL_TASK, _Poller(Path(run_dir), rank), POLL_S)


def _scripts_handler(signum: int) -> bool:
    """The script installed a handler of the dump signal itself (set up at
    ``init_process_group``, an mp.spawn rank runs the script's code first): it is never
    replaced (issue 28, NEW-1); that rank gives no stack dump."""
    try:
        handler = signal.getsignal(signum)
    except (ValueError, OSError):
        return False
    return callable(handler)


def stop_poller(limit_s: float = 2.0) -> None:
    """Take the request poller off the service, waiting (up to ``limit_s``) for a poll
    under way to end: it writes under the rank it was started for."""
    threads.service().remove(POLL_TASK, limit_s)


class _Poller:
    """One poll for the watchdog's requests (a task of gpudiag's service thread, every
    ``POLL_S``): a stack request, a finish request, stale collective times, the live
    in-flight file."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.request = request_path(run_dir, rank)
        self.finish = finish_request_path(run_dir, rank)
        self.live = _LiveInflight(run_dir, rank)

    def __call__(self) -> object:
        if _STOP.is_set():
            return threads.STOP
        try:
            if self.request.exists():
                try:
                    write_inflight(self.run_dir, self.rank)
                finally:
                    _unlink(self.request)
            if self.finish.exists():
                self.live.stop()  # the watchdog decided: the job ends, inflight.json says the rest
                _finish(self.finish)
            _flush_stale_times()
            try:
                self.live.tick()
            except Exception:  # noqa: BLE001 - the live file is optional, the poller is not
                self.live.stop()
        except Exception:  # noqa: BLE001 - the poller must outlive a bad request
            pass
        return None


def _finish(path: Path) -> None:
    reason = rundir.read_json(path)
    if not isinstance(reason, str):
        reason = ""
    _unlink(path)
    if _FINISHER is not None:
        _FINISHER(reason)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class _LiveInflight:
    """Writes ``inflight_live.json`` from the poller when the set of collectives
    in flight for over ``rundir.LIVE_INFLIGHT_AGE_S`` changes (checked every
    ``LIVE_EVERY_S``). A healthy job has none, so it writes the (empty) file once."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = rundir.rank_dir(run_dir, rank) / rundir.LIVE_INFLIGHT
        self._last_check = 0.0
        self._written: tuple | None = None
        self._stopped = False
        self._fr_step: int | None = -1
        self._pending: list[dict[str, Any]] = []

    def stop(self) -> None:
        self._stopped = True

    def tick(self) -> None:
        now = time.monotonic()
        if self._stopped or now - self._last_check < LIVE_EVERY_S:
            return
        self._last_check = now
        from gpudiag.capture import collectives

        recorder = collectives.active_recorder()
        if recorder is None:
            return
        cutoff = time.time_ns() - int(rundir.LIVE_INFLIGHT_AGE_S * 1e9)
        waiting = [r for r in recorder.inflight.snapshot() if r.get("enter_ns", cutoff) < cutoff]
        self._update_pending(recorder)
        key = tuple(
            sorted((str(r.get("pg_name")), r.get("seq"), r["enter_ns"]) for r in waiting)
        ) + tuple((str(r["pg_name"]), r["seq"], -1) for r in self._pending)
        if key == self._written:
            return
        groups = collectives._pg_info() if waiting or self._pending else {}
        rows = [
            {
                "pg_name": r.get("pg_name"),
                "seq": r.get("seq"),
                "op": r.get("op"),
                "enter_ns": r.get("enter_ns"),
                "source": r.get("source"),
                "callsite": r.get("callsite"),
                "pg_ranks": _pg_ranks(groups, r.get("pg_name")),
            }
            for r in waiting
        ]
        pending = [
            dict(r, pg_ranks=groups.get(r["pg_name"], (None, None))[1]) for r in self._pending
        ]
        snapshot = {
            "t_ns": time.time_ns(),
            "last_step": recorder._last_step,
            "inflight": rows,
            "fr_pending": pending,
        }
        try:
            rundir.write_json_atomic(self.path, snapshot)
        except OSError as exc:  # full disk: the live view just misses it
            rundir.note_write_problem(self.path, exc)
            self._stopped = True
            return
        self._written = key

    def _update_pending(self, recorder: Any) -> None:
        """FR entries of the current step not yet written to collectives.jsonl, dumped
        once per step when the rank has not ended a step for LIVE_FR_IDLE_S."""
        from gpudiag.capture import collectives

        ends = recorder._step_ends
        last_end = ends[-1] if ends else None
        if last_end is None or time.time_ns() - last_end < LIVE_FR_IDLE_S * 1e9:
            self._pending = []
            return
        if not recorder.fr_enabled or self._fr_step == recorder._last_step:
            return
        self._fr_step = recorder._last_step
        pending = []
        for ring, entries in collectives.dump_flight_recorder_rings().items():
            pending += _unwritten_calls(entries, recorder.watermark(ring), last_end)
        self._pending = pending


def _unwritten_calls(entries: list[dict[str, Any]], watermark: int, last_end: int) -> list[dict]:
    """FR entries created after the last step's end and not yet written, as pending calls."""
    from gpudiag.capture import collectives

    pending = []
    for e in entries:
        created = e.get("time_created_ns") or 0
        seq = e.get("collective_seq_id")
        if e.get("is_p2p") or not isinstance(seq, int) or created <= last_end:
            continue
        if not isinstance(e.get("record_id"), int) or e["record_id"] <= watermark:
            continue
        pg = (list(e.get("process_group") or [""]) + [""])[0]
        op = collectives.normalise_op(e.get("profiling_name", ""))
        pending.append({"pg_name": pg, "seq": seq, "op": op, "enter_ns": created})
    return pending


def _flush_stale_times() -> None:
    """Completed collectives reach the disk within a poll even while the main thread is
    blocked (a loop without optimizer steps that hangs after a few collectives): the
    watchdog arms on those rows and then sees that nothing moves."""
    from gpudiag.capture import collectives

    recorder = collectives.active_recorder()
    if recorder is not None:
        recorder.flush_stale_times()


def inflight_snapshot() -> dict[str, Any]:
    """What this rank is waiting in, from the collective recorder and the FR ring."""
    from gpudiag.capture import collectives

    recorder = collectives.active_recorder()
    entered = recorder.inflight.snapshot() if recorder is not None else []
    groups = collectives._pg_info()
    for record in entered:
        record["pg_ranks"] = _pg_ranks(groups, record.get("pg_name"))
    fr_open = [
        collectives.fr_entry_to_row(e, groups) | {"state": e.get("state")}
        for e in collectives.dump_flight_recorder()
        if not e.get("retired") and e.get("state") != "completed"
    ]
    return {
        "t_ns": time.time_ns(),
        "pid": os.getpid(),
        "last_step": None if recorder is None else recorder._last_step,
        "inflight": entered,
        "fr_unfinished": fr_open,
    }


def write_inflight(run_dir: Path, rank: int) -> None:
    path = rundir.rank_dir(run_dir, rank) / rundir.INFLIGHT
    try:
        rundir.write_json_atomic(path, inflight_snapshot())
    except OSError as exc:  # full disk: the watchdog reports the rank as not answering
        rundir.note_write_problem(path, exc)


def _pg_ranks(groups: dict[str, tuple[int, list[int]]], name: Any) -> list[int] | None:
    """The global ranks of the process group ``name``, None when it is unknown here."""
    info = groups.get(name) if isinstance(name, str) else None
    return info[1] if info is not None else None
