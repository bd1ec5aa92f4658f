"""Step detection for every step of the run, with no change to the training script.

A step ends in the global optimizer step post hook of the first optimizer seen (so a
loop with two optimizers does not count double) or at ``gpudiag.step()``. The first step
starts at the first DataLoader batch or the first module forward, whichever comes first;
every later step starts where the previous one ended. Per step we also keep the time
spent inside DataLoader ``__next__`` (data_ns) and inside ``optimizer.step`` (pre hook
to post hook, every optimizer; optimizer_ns), and, where Linux gives it
(``/proc/self/task/<tid>/schedstat``), the training thread's time on a CPU (cpu_ns) and
runnable but waiting for one (runq_ns): what tells a rank starved by other processes
from one that is slow by itself (docs/findings.md).

Everything here runs on the training hot path: a boundary costs one JSON line written
and flushed plus a few attribute updates.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from gpudiag import rundir

StepCallback = Callable[[int, int], None]


# torch.compile(module) warns on every call while any global module hook exists (its
# hooks would fire once more, for the OptimizedModule). gpudiag's one global hook (the
# first forward, and the next forward after a profiling window) fires once per step at
# most and only once matters: the warning would be gpudiag's, not the job's (issue 28
# probe: printed twice under `gpudiag trace`, never under plain python). It is silenced
# only while that hook is registered, and only if no other global hook existed when it
# was (the job's own hooks keep their warning).
_COMPILE_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
_compile_warning_filter: tuple[Any, ...] | None = None


def _add_global_forward_hook(hook: Callable[..., Any]) -> Any:
    global _compile_warning_filter
    from torch.nn.modules import module

    has_hooks = getattr(module, "_has_any_global_hook", None)  # private: absent, no filter
    if has_hooks is not None and not has_hooks() and _compile_warning_filter is None:
        warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
        _compile_warning_filter = warnings.filters[0]
    return module.register_module_forward_pre_hook(hook)


def _remove_global_forward_hook(handle: Any) -> None:
    global _compile_warning_filter
    handle.remove()
    if _compile_warning_filter is None:
        return
    try:
        warnings.filters.remove(_compile_warning_filter)  # type: ignore[attr-defined]
        warnings._filters_mutated()  # type: ignore[attr-defined]  # the filter cache
    except (ValueError, AttributeError):  # the job reset the filters meanwhile
        pass
    _compile_warning_filter = None


class StepTracker:
    def __init__(self, run_dir: Path, rank: int, origin_ns: int | None = None) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.step = 0  # index of the step in progress (0-based, = ProfilerStep#N)
        self.start_ns: int | None = None
        self.origin_ns = origin_ns or time.time_ns()
        self.data_ns = 0
        self.optimizer_ns = 0
        self.api_driven = False
        self.durations_ns: list[int] = []
        self.data_total_ns = 0
        self.optimizer_total_ns = 0
        self.profiler: Any = None  # ProfilerWindow or None
        self.on_step_end: list[StepCallback] = []
        self._primary_optimizer: Any = None
        self._optimizer_entered: dict[int, int] = {}
        self._writer = rundir.open_rank_table(run_dir, rank, rundir.STEPS)
        self._regions: rundir.JsonlWriter | None = None
        self._handles: list[Any] = []
        self._dataloader_patch: tuple[Any, Any] | None = None
        self._first_forward_handle: Any = None
        self._export_patch: tuple[Any, Any] | None = None
        self._sched = ThreadSchedStat()
        # The thread that runs the steps: the one that installed the tracker when its
        # first batch or forward began the first step, else the one that ended the first
        # step. Only it starts, stops or exports the profiler: torch crashes (SIGSEGV at
        # export) when another does, as when gpudiag.step() came from a second thread, a
        # prefetch thread's first batch began step 0, or a new thread reused the ident of
        # the ended one that started it (issue 28 probes). Hence a Thread, not an ident.
        # When it has ended, the next thread that ends a step takes over (a loop run in
        # chunks, each in a new thread).
        self._owner = threading.current_thread()
        self._owner_settled = False

    # ------------------------------------------------------------------ installation

    def install(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(register_optimizer_step_post_hook(self._optimizer_post))
        self._first_forward_handle = _add_global_forward_hook(self._first_forward)
        self._patch_dataloader()
        self._patch_export()

    def _patch_export(self) -> None:
        """``torch.export.export(strict=True)`` fails while any global module hook is
        registered (dynamo then calls through Module.__call__ into its own wrapper, which
        it will not trace: probe 28f). The first-forward hook is set aside while an
        export runs, and put back after it if it was there."""
        import torch.export as export_module

        original = export_module.export
        tracker = self

        @functools.wraps(original)
        def export(*args: Any, **kwargs: Any) -> Any:
            had = tracker._first_forward_handle is not None
            tracker._remove_first_forward_hook()
            try:
                return original(*args, **kwargs)
            finally:
                if had and tracker._first_forward_handle is None:
                    tracker._first_forward_handle = _add_global_forward_hook(tracker._first_forward)

        export_module.export = export
        self._export_patch = (export_module, original)

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._remove_first_forward_hook()
        if self._dataloader_patch is not None:
            cls, original = self._dataloader_patch
            cls.__next__ = original
            self._dataloader_patch = None
        if self._export_patch is not None:
            module, export = self._export_patch
            module.export = export
            self._export_patch = None

    def _patch_dataloader(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original = _BaseDataLoaderIter.__next__
        tracker = self

        def __next__(self_iter: Any) -> Any:
            if tracker.start_ns is None:
                tracker.begin_first_step_here()
            elif tracker.stop_pending_here():
                tracker.settle_profiler()
            t0 = time.time_ns()
            try:
                return original(self_iter)
            finally:
                tracker.data_ns += time.time_ns() - t0

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign, assignment]
        self._dataloader_patch = (_BaseDataLoaderIter, original)

    def _first_forward(self, module: Any, args: Any) -> None:
        if _tracing():
            # torch.jit.trace: a range opened now would be traced into the graph;
            # torch.compile: dynamo traces this hook, and threading in it broke the
            # graph (fullgraph=True, torch.export: the job died; probe 28f)
            return
        if self.start_ns is None:
            if not self.begin_first_step_here():
                return  # another thread's forward: the hook waits for the training thread
        elif self.stop_pending_here():
            self.settle_profiler()
        if self.profiler is None or not self.profiler.stop_pending:
            self._remove_first_forward_hook()

    def stop_pending_here(self) -> bool:
        """A window waits to be stopped, and this thread is the one that may stop it."""
        return (
            self.profiler is not None
            and self.profiler.stop_pending
            and threading.current_thread() is self._owner
        )

    def _remove_first_forward_hook(self) -> None:
        handle = getattr(self, "_first_forward_handle", None)
        if handle is not None:
            _remove_global_forward_hook(handle)
            self._first_forward_handle = None

    # ------------------------------------------------------------------ boundaries

    def begin_first_step_here(self) -> bool:
        """The first batch or forward begins the first step, in the thread that installed
        the tracker (the script's). Not in another: a prefetch thread's first batch or an
        evaluation thread's forward before the training loop's first is not the first
        step, and a profiler it started would belong to a thread that may end first (the
        export then crashed: SIGSEGV). A training loop that runs in a thread of its own
        has its first step begun at the tracker's start (origin_ns), and its profiler
        window starts at that step's end (ProfilerWindow.move_past)."""
        if threading.current_thread() is not self._owner:
            return False
        self.begin_first_step()
        return True

    def begin_first_step(self, now_ns: int | None = None) -> None:
        self.start_ns = now_ns or time.time_ns()
        self._sched.open_for_this_thread()
        self._start_step_in_profiler()

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._primary_optimizer is None:
            self._primary_optimizer = optimizer
        self._optimizer_entered[id(optimizer)] = time.time_ns()

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        now = time.time_ns()
        entered = self._optimizer_entered.pop(id(optimizer), None)
        if entered is not None:
            self.optimizer_ns += now - entered
        if optimizer is self._primary_optimizer and not self.api_driven:
            self._end_step(now, "optimizer")

    def api_step(self) -> None:
        now = time.time_ns()
        self.api_driven = True
        self._end_step(now, "api")

    def _end_step(self, now: int, source: str) -> None:
        start = self.start_ns if self.start_ns is not None else self.origin_ns
        step = self.step
        # formatted directly (all ints, source a fixed word): this is the per-step hot path
        self._writer.write_text(
            f'{{"step":{step},"start_ns":{start},"end_ns":{now},"data_ns":{self.data_ns},'
            f'"optimizer_ns":{self.optimizer_ns},{self._sched.step_fields()}'
            f'"source":"{source}"}}\n'
        )
        self.durations_ns.append(now - start)
        self.data_total_ns += self.data_ns
        self.optimizer_total_ns += self.optimizer_ns
        self.data_ns = 0
        self.optimizer_ns = 0
        if not self._owner_settled:
            # the thread that began the first step runs them; when none did (the loop
            # runs in a thread of its own), the one that ends it. Not a thread that only
            # calls gpudiag.step(): the profiler would start there while another trains.
            self._owner_settled = True
            if self.start_ns is None and threading.current_thread() is not self._owner:
                self._take_over_steps(step)
                if self.profiler is None or not self.profiler.stop_pending:
                    self._remove_first_forward_hook()
        elif threading.current_thread() is not self._owner and not self._owner.is_alive():
            self._take_over_steps(step)
        in_owner = threading.current_thread() is self._owner
        if self.profiler is not None and in_owner:
            self.profiler.on_step_end(step, inside_optimizer=source == "optimizer")
            if self.profiler.stop_pending and source == "optimizer":
                self._settle_as_optimizer_step_returns()
            if self.profiler.stop_pending and self._first_forward_handle is None:
                # the window closes at the next batch or forward, outside Optimizer.step
                self._first_forward_handle = _add_global_forward_hook(self._first_forward)
        for callback in tuple(self.on_step_end):  # a callback may remove itself
            callback(step, now)
        self.step = step + 1
        self.start_ns = now
        if in_owner:
            self._start_step_in_profiler()

    def _take_over_steps(self, step: int) -> None:
        """This thread runs the steps from now on (none began the first step here, or the
        one that ran them has ended). A window not started yet moves past the steps it
        missed; one running in an ended thread cannot be stopped from this one
        (ProfilerWindow)."""
        self._owner = threading.current_thread()
        self._sched.reopen_for_this_thread()
        if self.profiler is None:
            return
        if self.profiler.active:
            self.profiler.abandon_if_its_thread_ended()
        self.profiler.move_past(step + 1)

    def _settle_as_optimizer_step_returns(self) -> None:
        """Stop the window as the Optimizer.step this thread is in returns: outside its
        ``Optimizer.step#`` annotation (module doc of profiling), in the thread that
        started the profiler, and before that thread can end (a loop in a thread of its
        own whose window ends on its last step, an optimizer stepped by a thread of its
        own that never loads a batch: the next batch or forward never came there, and the
        trace was lost). A one-shot profile function of this thread only; where the script
        has its own (cProfile, a debugger) the next batch or forward stops the window."""
        if sys.getprofile() is not None:
            return
        target = _outermost_optimizer_step_frame()
        if target is None:
            return

        def on_event(frame: FrameType, event: str, arg: Any) -> None:
            if event != "return" or frame is not target:
                return
            sys.setprofile(None)
            if self.stop_pending_here():
                try:
                    self.settle_profiler()
                except Exception:  # noqa: BLE001 - never into the script's optimizer step
                    pass

        sys.setprofile(on_event)

    def _start_step_in_profiler(self) -> None:
        if self.profiler is not None and self.profiler.on_step_start(self.step):
            # starting the profiler took time that belongs to no step
            self.start_ns = time.time_ns()

    def settle_profiler(self) -> None:
        """Stop and export a window whose last step has ended; the time it takes is
        taken out of the step in progress (its start moves later by that much)."""
        t0 = time.time_ns()
        self.profiler.settle(self.step)
        if self.start_ns is not None:
            self.start_ns += time.time_ns() - t0

    # ------------------------------------------------------------------ regions

    def record_region(self, name: str, start_ns: int, end_ns: int) -> None:
        if self._regions is None:
            self._regions = rundir.open_rank_table(self.run_dir, self.rank, rundir.REGIONS)
        self._regions.write(
            {"name": name, "start_ns": start_ns, "end_ns": end_ns, "step": self.step}
        )

    # ------------------------------------------------------------------ end of run

    @property
    def steps_completed(self) -> int:
        return len(self.durations_ns)

    def stats(self) -> dict[str, Any]:
        return step_stats(self.durations_ns, self.data_total_ns, self.optimizer_total_ns)

    def close(self) -> None:
        self._sched.close()
        self._writer.close()
        if self._regions is not None:
            self._regions.close()


class ThreadSchedStat:
    """The training thread's scheduler counters (``/proc/self/task/<tid>/schedstat``:
    ns on a CPU, ns runnable waiting for one) read at each step boundary, one ``pread``
    (about 1 µs). Opened by the thread that runs the steps; silent where Linux does not
    give the file (other OS, no CONFIG_SCHED_INFO): the steps then lack the two fields."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._last: tuple[int, int] | None = None
        self._threads = ThreadsRunQueue()

    def reopen_for_this_thread(self) -> None:
        """The steps turned out to run in this thread, not the one that opened it."""
        fd, self._fd = self._fd, None
        _close_quietly(fd)
        self.open_for_this_thread()

    def open_for_this_thread(self) -> None:
        if self._fd is not None:
            return
        try:
            self._fd = os.open(
                f"/proc/self/task/{threading.get_native_id()}/schedstat",
                os.O_RDONLY | os.O_CLOEXEC,
            )
        except (OSError, AttributeError):
            self._fd = None
            return
        self._last = self._read()

    def _read(self) -> tuple[int, int] | None:
        if self._fd is None:
            return None
        try:
            on_cpu, waiting = os.pread(self._fd, 96, 0).split()[:2]
            return int(on_cpu), int(waiting)
        except (OSError, ValueError):
            return None

    def step_fields(self) -> str:
        """``"cpu_ns":N,"runq_ns":M,"threads_runq_ns":T,`` for the step that just ended
        ('' when unknown; T only where every thread could be read)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return ""
        threads = self._threads.step_delay()
        every = f'"threads_runq_ns":{threads},' if threads is not None else ""
        return f'"cpu_ns":{now[0] - last[0]},"runq_ns":{now[1] - last[1]},{every}'

    def close(self) -> None:
        self._threads.close()
        fd, self._fd = self._fd, None
        _close_quietly(fd)


_OPTIMIZER_STEP_CODE: list[CodeType] = []


def _outermost_optimizer_step_frame() -> FrameType | None:
    """The outermost frame of torch's ``Optimizer.step`` wrapper (the one that holds the
    ``Optimizer.step#...`` annotation) on this thread's stack, or None."""
    if not _OPTIMIZER_STEP_CODE:
        from torch.optim.optimizer import Optimizer

        _OPTIMIZER_STEP_CODE.append(Optimizer.profile_hook_step(_no_step).__code__)
    code = _OPTIMIZER_STEP_CODE[0]
    found = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            found = frame
        frame = frame.f_back
    return found


def _tracing() -> bool:
    """The forward runs under ``torch.jit.trace`` (a ``ProfilerStep`` range begun in it
    became an op of the user's traced graph, and the trace's check failed the job:
    TracingCheckError; probe 28e) or is being compiled (dynamo traces global hooks: what
    it cannot trace breaks the graph, and fails ``fullgraph=True``). The compile check
    comes first: dynamo folds it to True and traces nothing past it."""
    import torch

    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing())


def _no_step(*args: Any, **kwargs: Any) -> None:
    return None


def _close_quietly(fd: int | None) -> None:
    """Close a /proc file the counters kept open (gone already: nothing to do)."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class ThreadsRunQueue:
    """The run-queue delay of every thread of the process per step (the sum over its
    threads: the training thread, gloo's transfer threads, intra-op and loader-pinning
    threads), so that a rank whose helper threads wait for a CPU shows as starved, not
    as blocked. One ``pread`` per thread per step, the thread list re-read every
    :data:`REFRESH_STEPS` steps; a thread that ended is dropped, one that started
    counts from its first reading."""

    REFRESH_STEPS = 16

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._steps = 0
        self._broken = False

    def step_delay(self) -> int | None:
        if self._broken:
            return None
        if self._steps % self.REFRESH_STEPS == 0:
            self._refresh()
        self._steps += 1
        total = 0
        for tid, fd in list(self._fds.items()):
            try:
                delay = int(os.pread(fd, 96, 0).split()[1])
            except (OSError, ValueError, IndexError):
                self._drop(tid)
                continue
            before = self._last.get(tid)
            self._last[tid] = delay
            if before is not None and delay > before:
                total += delay - before
        return total if not self._broken else None

    def _refresh(self) -> None:
        try:
            tids = set(os.listdir("/proc/self/task"))
        except OSError:
            self._broken = True
            return
        for tid in set(self._fds) - tids:
            self._drop(tid)
        for tid in tids - set(self._fds):
            try:
                self._fds[tid] = os.open(
                    f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC
                )
            except OSError:
                continue

    def _drop(self, tid: str) -> None:
        self._last.pop(tid, None)
        _close_quietly(self._fds.pop(tid, None))

    def close(self) -> None:
        for tid in list(self._fds):
            self._drop(tid)


def step_stats(
    durations_ns: list[int], data_total_ns: int, optimizer_total_ns: int
) -> dict[str, Any]:
    count = len(durations_ns)
    if not count:
        return {"count": 0, "data_ns_total": 0, "optimizer_ns_total": 0}
    ms = sorted(d / 1e6 for d in durations_ns)
    p90 = ms[min(count - 1, int(round(0.9 * (count - 1))))]
    return {
        "count": count,
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": p90,
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "total_ms": sum(ms),
        "data_ns_total": data_total_ns,
        "optimizer_ns_total": optimizer_total_ns,
        "data_ms_mean": data_total_ns / count / 1e6,
        "optimizer_ms_mean": optimizer_total_ns / count / 1e6,
    }
