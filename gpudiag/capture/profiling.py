"""The torch.profiler window: steps A..B of the run, one gzipped Kineto trace per rank.

Each profiled step gets a ``ProfilerStep#N`` annotation whose N is gpudiag's own step
number (steps.jsonl). Steps end in the optimizer step post hook, which runs inside the
``Optimizer.step#...`` annotation, so that event would straddle the step boundary; the
exported trace is fixed up so ProfilerStep#k ends where that optimizer event ends and
ProfilerStep#k+1 starts there. For the same reason a window that ends in the hook is
stopped outside Optimizer.step ("stop pending"): as that Optimizer.step returns, in the
thread that runs the steps (StepTracker), else at its next batch or forward.

Default window (no --profile-steps): the profiler starts at step 0 so a short run still
gets a trace; when the run reaches step A the earlier steps are cut from the trace at
export, so warm-up is not in the trace of a long run.

The profiler is started at most once per process. torch's RecordFunction keeps, for a
range that is open, a pointer into the record queue of the profiler that saw it begin;
the exit callback writes the range's end time through that pointer into whatever
profiler is active when the range ends. Stopping one profiler and starting another while
a range is open (a ``gpudiag.region()``, a user ``record_function``, a DataLoader
``__next__``) makes that write land in the freed queue of the first: heap corruption,
then SIGSEGV or ``malloc(): ... corrupted`` in a later garbage collection. A single
session never has a second profiler to write into; a range still open when it stops
ends with no profiler active, which torch ignores.

For the same reason gpudiag never profiles beside the script's own profiler: a script
that creates a ``torch.profiler.profile`` (or has one enabled when the window would
start) keeps its profiler, and gpudiag's window is given up, said once.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture.worker_signals import real_getsignal, set_handler

DEFAULT_WINDOW = (5, 9)
STEP_PREFIX = "ProfilerStep#"
OPTIMIZER_PREFIX = "Optimizer.step#"
INCOMPLETE_PREFIX = "IncompleteStep#"


_CREATING = False  # gpudiag is creating its own profiler (not the script's)
_WINDOWS: list[ProfilerWindow] = []


def watch_for_script_profilers(window: ProfilerWindow) -> None:
    """From now on, a ``torch.profiler`` profiler created by anyone but gpudiag makes
    ``window`` give way (module doc)."""
    from torch.profiler import profiler as torch_profiler

    _WINDOWS[:] = [window]
    kineto = torch_profiler._KinetoProfile
    original = kineto.__init__
    if getattr(original, "_gpudiag_wrapped", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not _CREATING:
            for w in _WINDOWS:
                w.give_way("the script creates its own torch.profiler")

    __init__._gpudiag_wrapped = True  # type: ignore[attr-defined]
    kineto.__init__ = __init__  # type: ignore[method-assign]


def parse_window(text: str) -> tuple[int, int]:
    """'5-9' -> (5, 9); '7' -> (7, 7). Raises ValueError with a readable message."""
    first, sep, last = text.strip().partition("-")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise ValueError(f"--profile-steps {text!r}: expected A-B, e.g. 5-9") from None
    if a < 0 or b < a:
        raise ValueError(f"--profile-steps {text!r}: need 0 <= A <= B")
    return a, b


class ProfilerWindow:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        window: tuple[int, int],
        provisional: bool,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.world_size = world_size
        self.first, self.last = window
        self.provisional_enabled = provisional and self.first > 0
        self.stop_pending = False
        self.done = False
        self.exported: Path | None = None
        self.export_error: str | None = None
        self.profiled_steps: list[int] = []
        self.incomplete_step: int | None = None  # open when the run ended
        self._prof: Any = None
        self._annotation: Any = None
        self._annotated_step: int | None = None
        # set when a session started before step A reaches it: the trace is cut there
        self._cut_before_step: int | None = None
        self._started_in: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def give_way(self, why: str) -> None:
        """The script profiles by itself: stop (without a trace) or never start."""
        if self.done:
            return
        self.export_error = f"no trace: {why}"
        if self._prof is not None:
            try:  # runs inside the script's own profiler construction: never raise
                self.discard()
            except Exception as exc:  # noqa: BLE001
                self.export_error += f" (stopping gpudiag's: {type(exc).__name__}: {exc})"
        self.done = True
        self.stop_pending = False
        _say(f"gpudiag: rank {self.rank}: {why}; gpudiag's own profiler window is skipped")

    def move_past(self, next_step: int) -> None:
        """The first steps ran where the profiler could not start (the script's training
        loop runs in a thread of its own, which only its first step's end revealed): a
        window not started whose first step has passed begins at ``next_step`` instead,
        as long as it was, so that it is still profiled."""
        if self.done or self._prof is not None or self.first >= next_step:
            return
        width = self.last - self.first
        self.first, self.last = next_step, next_step + width
        self.provisional_enabled = False

    # ------------------------------------------------------------------ step events

    def on_step_start(self, step: int) -> bool:
        """Called at the start of every step; True when it just started the profiler."""
        if self.stop_pending or self.done:
            return False
        started = False
        if self._prof is None:
            if (self.provisional_enabled and step < self.first) or (
                self.first <= step <= self.last
            ):
                self._start()
                started = True
        elif self.provisional_enabled and step == self.first:
            # the real window begins in the session already running: never restart
            self._cut_before_step = self.first
            self.profiled_steps = []
        if self._prof is not None:
            self._open_annotation(step)
        return started

    def on_step_end(self, step: int, inside_optimizer: bool) -> None:
        if self._prof is None:
            return
        self._close_annotation()
        if self.profiled_steps[-1:] != [step]:
            self.profiled_steps.append(step)
        if step >= self.last:
            self.stop_pending = True
            if not inside_optimizer:
                self.settle(step + 1)

    def settle(self, current_step: int) -> None:
        """Do a pending stop, outside Optimizer.step (see the module doc)."""
        if not self.stop_pending:
            return
        self.stop_pending = False
        self._stop()

    def finish(self) -> None:
        """End of run: export whatever window is open (a short run's early steps included)."""
        if self._prof is None or self._abandoned_with_its_thread():
            return  # (its open annotation too: a range of the thread that ended)
        self.incomplete_step = self._annotated_step
        self._close_annotation()
        self.stop_pending = False
        self._stop()

    def discard(self) -> None:
        """Stop without writing a trace (this process hands its rank over)."""
        prof, self._prof = self._prof, None
        self.done = True
        self._close_annotation()
        if prof is not None:
            prof.stop()

    # ------------------------------------------------------------------ internals

    def abandon_if_its_thread_ended(self) -> None:
        """Another thread took over the steps (StepTracker): a profiler started in the
        one that ended is given up now, with the reason said once."""
        self._abandoned_with_its_thread()

    def _abandoned_with_its_thread(self) -> bool:
        """torch's profiler stopped from another thread than the one that started it,
        once that one has ended, crashes the process (SIGSEGV at export: a script that
        runs each step in a new thread, issue 28 probe). Then it is left running (its
        thread-local callbacks ended with that thread; the process ends with os._exit),
        with no trace and one line saying why."""
        started_in = self._started_in
        if started_in is None or started_in.is_alive():
            return False
        self._prof = None
        self.done = True
        self.stop_pending = False
        self.export_error = (
            "no trace: the profiler was started in a thread that has ended "
            f"({started_in.name}); stopping it from another crashes torch (steps run "
            "in threads that end: choose --profile-steps within one thread's steps)"
        )
        _say(f"gpudiag: rank {self.rank}: profiler trace not written ({self.export_error})")
        return True

    def _start(self) -> None:
        global _CREATING
        import torch
        from torch.profiler import ProfilerActivity, profile

        if torch._C._autograd._profiler_enabled():
            self.give_way("the script's own profiler is running")
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        _CREATING = True
        try:
            self._prof = profile(activities=activities, record_shapes=True, with_stack=False)
        finally:
            _CREATING = False
        self._prof.start()
        self._started_in = threading.current_thread()

    def _stop(self) -> None:
        if self._abandoned_with_its_thread():
            return
        prof, self._prof = self._prof, None
        self.done = True  # one session per process, whatever happens below
        try:
            with signals_held():
                prof.stop()
                self.exported = export_trace(
                    prof,
                    self.run_dir,
                    self.rank,
                    self.world_size,
                    self.incomplete_step,
                    cut_before_step=self._cut_before_step,
                )
        except Exception as exc:  # never let tracing kill training
            self.export_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, OSError):
                rundir.note_write_problem(rundir.trace_path(self.run_dir, self.rank), exc)
            _say(f"gpudiag: rank {self.rank}: profiler trace not written ({self.export_error})")
        finally:
            _collect_export_garbage()

    def _open_annotation(self, step: int) -> None:
        if self._annotated_step == step:
            return
        from torch.autograd.profiler import record_function

        self._annotation = record_function(f"{STEP_PREFIX}{step}")
        self._annotation.__enter__()
        self._annotated_step = step

    def _close_annotation(self) -> None:
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
        self._annotation = None
        self._annotated_step = None


def _collect_export_garbage() -> None:
    """A full garbage collection now, in the export's own time (taken out of the step,
    StepTracker.settle_profiler). The export's objects (the parsed trace, the profiler's
    events) moved into the oldest generation and left the collector owing a full pass:
    python then ran it at some later step, inside whatever allocated next, a DataLoader's
    ``__next__`` most often: 300-1,044 ms of "data wait" in one step, 8 steps after the
    window, on every rank, which plain python never had (probe 31n, D1: a false HIGH
    dataloader_stall in 5 of 5 profiled recordings)."""
    import gc

    gc.collect()


_HELD_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the window's trace is written, then act as they
    would have. Raised in the middle of the export they lost the trace of a job
    interrupted right after its window (3 Ctrl-Cs in 4 to a Lightning job at step 10:
    "profile window 5-9 not exported"). A second one while held acts at once: that is
    how a user says "now". Only the main thread receives signals; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        if signum in arrived:
            arrived.clear()
            _restore(previous)
            _deliver(signum, previous[signum], frame)
            return
        arrived.append(signum)

    for signum in _HELD_SIGNALS:
        handler = real_getsignal(signum)  # gpudiag's own too: it is put back
        if handler is None or handler is signal.SIG_IGN:
            continue  # set outside Python (could not be put back), or ignored: stays
        previous[signum] = handler
        set_handler(signum, hold)
    try:
        yield
    finally:
        _restore(previous)
        for signum in arrived:
            _deliver(signum, previous[signum], sys._getframe())


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        set_handler(signum, handler)


def _deliver(signum: int, handler: Any, frame: Any) -> None:
    """What a signal held back would have done under ``handler``."""
    if callable(handler):
        handler(signum, frame)  # KeyboardInterrupt, the worker's SIGTERM, the script's
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


def export_trace(
    prof: Any,
    run_dir: Path,
    rank: int,
    world_size: int,
    incomplete_step: int | None = None,
    cut_before_step: int | None = None,
) -> Path:
    """Export to a temp file, fix the step boundaries, gzip into place atomically."""
    import orjson

    final = rundir.trace_path(run_dir, rank)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp_json = final.with_name(f".rank{rank}.{os.getpid()}.json.tmp")
    tmp_gz = final.with_name(f".rank{rank}.{os.getpid()}.gz.tmp")
    dir_fd: int | None = None
    try:
        kineto_path, dir_fd = _kineto_path(tmp_json)
        if dir_fd is None and kineto_path != str(tmp_json):
            tmp_json = Path(kineto_path)  # a temporary file outside the run directory
        prof.export_chrome_trace(kineto_path)
        if not tmp_json.is_file():  # Kineto logs "Failed to write" and carries on
            raise _export_failure(tmp_json)
        trace = orjson.loads(tmp_json.read_bytes())
        fix_trace(trace, rank, world_size, incomplete_step, cut_before_step)
        trace["traceName"] = rundir.fs_text(str(final))  # Kineto wrote its temporary name
        with gzip.open(tmp_gz, "wb", compresslevel=6) as fh:
            fh.write(orjson.dumps(trace))
        os.replace(tmp_gz, final)
    finally:
        # Kineto writes <name>.tmp and renames it: left behind when its write failed
        kineto_tmp = tmp_json.with_name(tmp_json.name + ".tmp")
        for tmp in (tmp_json, tmp_gz, kineto_tmp):
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        if dir_fd is not None:
            os.close(dir_fd)
    return final


def _export_failure(path: Path) -> OSError:
    """Why torch.profiler wrote no trace at ``path``: Kineto logs "Failed to write" and
    carries on, without the OS error. Found again by writing there ourselves (1 MiB of
    data, then one byte at the file size limit's offset, a sparse file): the real error
    (ENOSPC, EFBIG, ENAMETOOLONG, EACCES...), not a guess."""
    probe = path.with_name(path.name + ".probe")
    limit = rundir.file_size_limit()
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            chunk = b"\0" * (1 << 16)
            for _ in range(16):
                os.write(fd, chunk)
            if limit is not None:
                os.pwrite(fd, b"\0", limit)  # EFBIG: past the limit
        finally:
            os.close(fd)
    except OSError as exc:
        err = exc.errno or errno.EIO
        text = exc.strerror or os.strerror(err)
        if err == errno.EFBIG and limit is not None:
            text += f": the file size limit (RLIMIT_FSIZE, ulimit -f) is {limit // 1024} KiB"
        return OSError(err, f"torch.profiler could not write its trace ({text})")
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return OSError(
        errno.EIO,
        "torch.profiler could not write its trace (Kineto gave no reason; a test write "
        "beside it succeeded)",
    )


def _kineto_path(tmp_json: Path) -> tuple[str, int | None]:
    """A name torch's exporter accepts for ``tmp_json``, and the directory descriptor it
    needs (close it after). torch takes the path as a C++ string: a str that is not
    valid UTF-8 (a run directory whose name has bytes that are not, which Python holds
    as lone surrogates) is refused with a TypeError and the trace was lost (issue 28,
    F7). Such a directory is reached through ``/proc/self/fd/<fd>/`` (ASCII); without
    /proc, the trace is exported to a temporary file beside the system's others."""
    name = str(tmp_json)
    if rundir.fs_text(name) == name:
        return name, None
    try:
        fd = os.open(tmp_json.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = None
    if fd is not None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            return f"/proc/self/fd/{fd}/{tmp_json.name}", fd
        os.close(fd)
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"gpudiag-{tmp_json.name}"), None


def fix_trace(
    trace: dict[str, Any],
    rank: int,
    world_size: int,
    incomplete_step: int | None = None,
    cut_before_step: int | None = None,
) -> None:
    """Make the trace self-describing and its step boundaries clean (see module doc).

    The step still open when the run ended (the tail after the last optimizer step, or
    the step a crash or interrupt cut short) is renamed ``IncompleteStep#N``, so tools
    that count ``ProfilerStep#`` see only steps that completed. With ``cut_before_step``
    everything that began before that step's start is dropped (warm-up, module doc)."""
    if not trace.get("distributedInfo"):
        trace["distributedInfo"] = {"backend": None, "rank": rank, "world_size": world_size}
    from gpudiag.capture.clock import test_shift_ns

    if test_shift_ns() and isinstance(trace.get("baseTimeNanoseconds"), int):
        trace["baseTimeNanoseconds"] += test_shift_ns()  # tests: a skewed host
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    fix_straddling_optimizer(events)
    if cut_before_step is not None:
        cut_events_before_step(trace, cut_before_step)
    if incomplete_step is not None:
        for event in events:
            if event.get("name") == f"{STEP_PREFIX}{incomplete_step}":
                event["name"] = f"{INCOMPLETE_PREFIX}{incomplete_step}"


def fix_straddling_optimizer(events: list[dict[str, Any]]) -> int:
    """Move each ProfilerStep boundary to the end of an Optimizer.step event that starts
    inside step k and ends after it. Returns how many boundaries moved."""
    steps = sorted(
        (e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)),
        key=lambda e: float(e["ts"]),
    )
    optimizers = [e for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIX)]
    # Durations are rounded to the trace's 1 ns resolution, so a boundary already moved
    # can end up to half a nanosecond before the optimizer's end: not a straddle.
    tolerance_us = 0.001
    moved = 0
    for i, step in enumerate(steps):
        ts = float(step["ts"])
        end = ts + float(step.get("dur", 0))
        straddling_ends = [
            float(o["ts"]) + float(o.get("dur", 0))
            for o in optimizers
            if o.get("tid") == step.get("tid")
            and ts <= float(o["ts"]) < end
            and end + tolerance_us < float(o["ts"]) + float(o.get("dur", 0))
        ]
        if not straddling_ends:
            continue
        new_end = max(straddling_ends)
        step["dur"] = round(new_end - ts, 3)
        moved += 1
        if i + 1 < len(steps):
            following = steps[i + 1]
            f_ts = float(following["ts"])
            if f_ts < new_end:
                f_end = f_ts + float(following.get("dur", 0))
                following["ts"] = new_end
                following["dur"] = round(max(0.0, f_end - new_end), 3)
    return moved


def cut_events_before_step(trace: dict[str, Any], step: int) -> int:
    """Drop every timed event that began before ``ProfilerStep#<step>`` began: what a
    profiler started at that point would have recorded. The session's own span (cat
    "Trace") is shortened to start there; metadata is kept, and so are flow arrows whose
    two ends are both kept. Returns how many events were dropped."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return 0
    name = f"{STEP_PREFIX}{step}"
    starts = [
        float(e["ts"])
        for e in events
        if isinstance(e, dict) and e.get("name") == name and isinstance(e.get("ts"), int | float)
    ]
    if not starts:
        return 0
    cut = min(starts)
    kept: list[Any] = []
    dropped_flows: set[Any] = set()
    for event in events:
        ts = event.get("ts") if isinstance(event, dict) else None
        if not isinstance(ts, int | float) or event.get("ph") == "M" or float(ts) >= cut:
            kept.append(event)
        elif event.get("cat") == "Trace" and event.get("ph") == "X":
            end = float(ts) + float(event.get("dur", 0))
            event["ts"], event["dur"] = cut, round(max(0.0, end - cut), 3)
            kept.append(event)
        elif event.get("ph") in ("s", "f", "t"):
            dropped_flows.add((event.get("cat"), event.get("id")))
    if dropped_flows:
        kept = [
            e
            for e in kept
            if not (
                isinstance(e, dict)
                and e.get("ph") in ("s", "f", "t")
                and (e.get("cat"), e.get("id")) in dropped_flows
            )
        ]
    trace["traceEvents"] = kept
    return len(events) - len(kept)


def _say(text: str) -> None:
    """One line on the rank's stderr (the process's own, as worker_outcome's: a job that
    reads its own stdout must not get gpudiag's lines; issue 28 probe 28c) that never
    raises: the script may have closed fd 2, pointed it at a read-only file or set
    sys.stderr to None (issue 28, F10), and this runs inside its code (the window's start
    and end). A KeyboardInterrupt still goes through."""
    try:
        print(text, file=sys.__stderr__ or sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - OSError, ValueError (closed), a loader's handler
        pass
