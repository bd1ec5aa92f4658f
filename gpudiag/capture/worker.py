"""Per-rank bootstrap, run by ``python -m gpudiag.capture.rank <script | -m module> [args...]``.

Started by ``gpudiag trace`` directly (one process) or through torch.distributed.run.
It installs the instrumentation, runs the user's code as ``__main__`` with runpy, and
whatever happens (normal end, sys.exit, exception, Ctrl-C, SIGTERM) writes the trace,
summary.json and status.json, destroys the process group, runs atexit handlers and
ends with ``os._exit``: interpreter teardown of a gloo worker aborts now and then
(FACTS.md), so gpudiag never relies on it.

Configuration comes from the launcher through environment variables (ENV_* below).
"""

from __future__ import annotations

import atexit
import builtins
import functools
import os
import runpy
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture import agent, deferred_signals, spawn
from gpudiag.capture.reexec import (  # noqa: F401 - public names re-exported
    ENV_REEXEC,
    REEXEC_WAIT_S,
    WORKER_MODULE,
    install_reexec_hook,
    reexec_command,
    wait_for_children,
)
from gpudiag.capture.script_run import (
    _argv0_as_given,
    _backend,
    _device,
    _init_method,
    _int_env,
    _make_room_for_our_frames,
    _profiles_itself,
    _rank_env,
    _set_path_head,
    _torch_versions,
    parse_target,
    torch_import_unfinished,
)
from gpudiag.capture.worker_exit import (  # noqa: F401 - public names re-exported
    LAUNCHER_LOST_GRACE_S,
    _destroy_process_group,
    _end_forked_child,
    _end_process,
    _end_when_launcher_lost,
    _exit_after,
    _flush_open_files,
    _join_user_threads,
    _stop_child_observers,
    _wait_for_exit,
)
from gpudiag.capture.worker_outcome import (  # noqa: F401 - public names re-exported
    EXIT_EXCEPTION,
    EXIT_HANG,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    LOADER_DEATH_WAIT_S,
    TRACEBACK_KEEP_CHARS,
    Outcome,
    _cut_traceback,
    _fatal_signal_outcome,
    _first_line,
    _loader_failure,
    _loader_worker_killed,
    _loader_worker_terminated,
    _outcome_of_exception,
    _outcome_of_exit,
    _print_exception,
    _raised_by_the_script,
    _say,
    _user_frames,
    safe_str,
)
from gpudiag.capture.worker_signals import (  # noqa: F401 - public names re-exported
    _RANK_PID,
    FATAL_SIGNALS,
    _claim_process,
    _handled_signal,
    _in_forked_child,
    _main_thread_line,
    _on_sigterm,
    _record_fatal_signals,
    _set_aside_sigchld,
    _Terminated,
    _user_code_running,
    hide_own_handlers,
    real_getsignal,
    release_fatal_signals,
    set_handler,
    sigterm_pending,
    take_sigterm,
)

ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_PROFILE_STEPS = "GPUDIAG_PROFILE_STEPS"  # "A-B" or "off"
ENV_PROFILE_DEFAULT = "GPUDIAG_PROFILE_DEFAULT"  # "1": window not chosen by the user
ENV_NODE_RANK = "GPUDIAG_NODE_RANK"
ENV_FINISH_TIMEOUT = "GPUDIAG_FINISH_TIMEOUT_S"
RANK_RESERVE_BYTES = rundir.RANK_RESERVE_BYTES  # summary.json and status.json, full disk
# A rank ended on a hang finishes from the poller thread: short, since the launcher
# kills what is left after its own grace (launcher.HANG_FLUSH_WAIT_S).
HANG_FINISH_TIMEOUT_S = 15.0


# python runs a script's __main__ with `__builtins__` the builtins module; runpy's exec
# would put the module's dict there, and a script that reads `__builtins__.print`
# failed (AttributeError: 'dict' object has no attribute; issue 28 probe 28e).
MAIN_GLOBALS = {"__builtins__": builtins}


def _check_module_as_python_would(name: str) -> None:
    """``-m pkg.missing`` or ``-m pkg`` without ``__main__``: python's one line and exit
    code 1, as ``python -m`` gives them (was runpy's traceback; the launcher checks only
    the top-level name, since finding a submodule imports its package). runpy's own
    check (``_get_module_details``, private): it imports the package, as -m does."""
    details = getattr(runpy, "_get_module_details", None)
    error = getattr(runpy, "_Error", None)
    if details is None or error is None:
        return
    try:
        details(name, error)
    except error as exc:
        print(f"{sys.executable}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _handler_is_ours(signum: int) -> bool:
    """The handler in place is gpudiag's (SIGTERM, a fatal signal's) or Python's Ctrl-C
    default: the script did not install its own (then what it does is its decision)."""
    try:
        handler = real_getsignal(signum)
    except (ValueError, OSError):
        return False
    if signum == signal.SIGTERM:
        return handler is _on_sigterm
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return getattr(handler, "__func__", None) is Worker.on_fatal_signal


def _deliver_held_signals() -> Outcome | None:
    """A Ctrl-C or SIGTERM held during gpudiag's set-up (deferred_signals) raised now,
    before the script's first line, as plain python would have it: the rank is
    interrupted there, with no traceback of gpudiag's."""
    try:
        deferred_signals.release_all()
    except _Terminated:
        return Outcome("interrupted", EXIT_SIGTERM, "SIGTERM", "before the script started")
    except KeyboardInterrupt:
        return Outcome("interrupted", EXIT_SIGINT, "KeyboardInterrupt", "before the script started")
    return None


def _note_untraced(line: str) -> None:
    """Said on stderr at once and kept in the rank's record (status.json ``incomplete``:
    `analyze` and the dashboard show it as a warning)."""
    said = bool(rundir.write_problems())  # note_problem says only a process's first
    rundir.note_problem(line)
    if said:
        _say(f"gpudiag: {line}")


class Worker:
    def __init__(self, run_dir: Path, target: dict[str, str], script_args: list[str]) -> None:
        self.run_dir = run_dir
        self.target = target
        self.script_args = script_args
        self.rank, self.local_rank, self.world_size = _rank_env()
        self.start_ns = time.time_ns()
        self.rank_info: dict[str, Any] = {}
        self.tracker: Any = None
        self.profiler: Any = None
        self.recorder: Any = None
        self._kept: Any = None  # the script's globals or its exception, kept until os._exit
        self._reserve: Path | None = None
        self._status_written = False
        self._finish_lock = threading.Lock()
        self.set_up = False
        self.handed_over = False  # the script spawned its own ranks (spawn.py)
        self.runs_atexit = True  # False in a worker multiprocessing ends with os._exit
        # gpudiag started this one process (no torchrun): its rank and world size are
        # known only when the script calls init_process_group
        self.launched_alone = "RANK" not in os.environ
        # where rank and world size came from (rank_info.json ``rank_source``):
        # "environment" (torchrun), "default" (one process, no process group yet),
        # "init_process_group"
        self.rank_source = "default" if self.launched_alone else "environment"
        # how this process was started (rank_info.json ``started_by``): "gpudiag",
        # "torchrun", "spawn" (torch.multiprocessing), "reexec" (the script re-executed
        # by a traced rank, e.g. Lightning's subprocess launcher)
        self.started_by = "gpudiag" if self.launched_alone else "torchrun"
        self.reexec_children: list[Any] = []  # subprocess.Popen of re-executed ranks
        # how the script's init_process_group met its peers (rank_info ``init_method``):
        # what ties together the directories of ranks started by separate launches
        self.init_method: str | None = None

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        self.rank_info = self._rank_info_document(_device(self.local_rank), _torch_versions())
        if self.started_by == "reexec":
            self.rank_info["parent_pid"] = _int_env(ENV_REEXEC)
        self._take_reserve()  # before anything else of this rank is written
        self._write_rank_info()
        self.set_up = True
        self._install_collectives()
        self._install_steps()
        if threading.current_thread() is threading.main_thread():
            # where the default is only: set up at init_process_group (a spawned or
            # re-executed rank, a rank moved to the one the call names), the script's
            # code has run, and a SIGTERM handler it installed stays (NEW-1)
            take_sigterm()
            hide_own_handlers()  # a rank mp.spawn started does not pass through main()
        if self.launched_alone and self.target:  # gpudiag started this one process
            self._guard("spawn hook", lambda: spawn.install(self.hand_over_rank, run_spawned_rank))
            self._guard("spawn exits", lambda: spawn.watch_exits(agent.write_spawned_failure))
            self._guard("elastic note", lambda: spawn.install_elastic_note(_note_untraced))
            self._guard("process count", spawn.count_processes)
            self._guard(
                "re-exec hook", lambda: install_reexec_hook(self.target, self.reexec_children)
            )
            if self.rank_source == "default":
                self._guard("init_process_group hook", self.setup_at_init_process_group)

    def _setup_at_exit(self) -> None:
        """Set up when finishing a rank that was not (a spawned rank that never called
        init_process_group, a set-up that Ctrl-C or SIGTERM interrupted): only its record
        when torch's import was interrupted, as importing torch again would crash the
        process (SIGABRT or SIGSEGV before status.json: probe 28j, F2)."""
        if not torch_import_unfinished():
            self.setup()
            return
        self.rank_info = self._rank_info_document(None, None)
        if self.started_by == "reexec":
            self.rank_info["parent_pid"] = _int_env(ENV_REEXEC)
        self._take_reserve()
        self._write_rank_info()
        self.set_up = True

    def _rank_info_document(self, device: str | None, versions: Any) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node_rank": int(os.environ.get(ENV_NODE_RANK, os.environ.get("GROUP_RANK", "0"))),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "backend": None,
            "device": device,
            "versions": versions,
            "start_ns": self.start_ns,
            "rank_source": self.rank_source,
            "started_by": self.started_by,
            "init_method": self.init_method,
        }

    def _take_reserve(self) -> None:
        """The room for summary.json and status.json, before this rank writes anything:
        the reserve this rank already had (set up again as another rank), else the one
        its launcher wrote for this local rank (a rename: no new blocks), else one of its
        own. Without one, a full disk may cost this rank its status: said once."""
        target = rundir.rank_dir(self.run_dir, self.rank) / rundir.RESERVE
        reserve = rundir.adopt_reserve(self._reserve, target)
        if reserve is None:
            handed = rundir.handed_reserve_path(self.run_dir, self._node(), self.local_rank)
            reserve = rundir.adopt_reserve(handed, target)
        if reserve is None:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                pass
            reserve = rundir.reserve_space(target, rundir.RANK_RESERVE_BYTES)
        fsize = rundir.file_size_limit()
        if reserve is None and (fsize is None or fsize >= rundir.RANK_RESERVE_BYTES):
            rundir.note_write_problem(
                target, rundir.why_unwritable(target.parent), "no room kept for status.json"
            )
        self._reserve = reserve

    def _node(self) -> int:
        node = self.rank_info.get("node_rank")
        if isinstance(node, int):
            return node
        return _int_env(ENV_NODE_RANK) or _int_env("GROUP_RANK") or 0

    def hand_over_rank(self) -> None:
        """The script spawns its own workers (torch.multiprocessing): they become the
        ranks of the run, rank 0 included. This process stops recording and removes
        what it wrote as rank 0; it keeps the job's exit code."""
        self.handed_over = True
        self._stop_recording()
        self._guard("fatal signals", release_fatal_signals)
        self._guard("spawn parent", agent.note_spawn_parent)
        # dies with the launcher as the script's process dies of a SIGKILL under plain
        # python: its workers get torch's parent-death SIGINT at once. Its SIGTERM ended
        # it gracefully, and multiprocessing's exit waited for the workers, which trained
        # on until the launcher watch's 15 s grace ran out (probe 28i, F4)
        self._guard("parent death", functools.partial(agent.die_with_parent, signal.SIGKILL))

    def _stop_recording(self) -> None:
        """Undo set-up and remove this rank's directory (nothing of it is kept)."""
        from gpudiag.capture import api
        from gpudiag.capture.hangdump import set_finisher, stop_poller, uninstall_hang_dump

        set_finisher(None)
        self._guard("hang dump", uninstall_hang_dump)
        if self.tracker is not None:
            api.install(None)
            self._guard("step tracker", self.tracker.uninstall)
            self._guard("step table", self.tracker.close)
        if self.profiler is not None and self.profiler.active:
            self._guard("profiler", self.profiler.discard)
        if self.recorder is not None:
            self._guard("collective patches", lambda: spawn.restore_collectives(self.recorder))
            for writer in (self.recorder._coll_writer, self.recorder._times_writer):
                if writer is not None:
                    self._guard("collective tables", writer.close)
            self.recorder._coll_writer = self.recorder._times_writer = None
            self.recorder._closed = True
        self.tracker = self.profiler = self.recorder = None
        stop_poller(2.0)  # it writes under the old rank
        # the reserve outlives the directory: set up again (or a spawned rank) takes it
        self._reserve = rundir.adopt_reserve(
            self._reserve, rundir.handed_reserve_path(self.run_dir, self._node(), self.local_rank)
        )
        shutil.rmtree(rundir.rank_dir(self.run_dir, self.rank), ignore_errors=True)
        self.set_up = False

    def setup_at_init_process_group(self) -> None:
        """Take the rank and world size from init_process_group: a spawned or
        re-executed rank sets up only then (the spawn index or LOCAL_RANK is assumed
        until then); a process gpudiag started alone, set up as rank 0 of 1, adopts
        them (see :meth:`adopt_process_group`)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.init_process_group
        worker = self

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            c10d.init_process_group = original
            if dist.init_process_group is init_process_group:
                dist.init_process_group = original
            try:
                worker.init_method = _init_method(args, kwargs)
                worker.adopt_process_group(dist.get_rank(), dist.get_world_size())
            except Exception as exc:  # noqa: BLE001 - never stop the training
                worker._warn(f"instrumentation incomplete ({type(exc).__name__}: {exc})")
            return result

        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group

    def adopt_process_group(self, rank: int, world_size: int) -> None:
        """The script's init_process_group made this process ``rank`` of ``world_size``.
        Not set up yet: set up as that rank. Set up as another rank (rank 0 of a world
        of 1, the guess of a process gpudiag started alone, whose script passed
        ``rank=``/``world_size=`` itself): move to it, unless steps were already
        recorded (then the rank stays as recorded, with a warning)."""
        if self.handed_over or _in_forked_child():
            # a forked child of a process that spawned its ranks, or one the rank forked
            # (multiprocessing's fork context: the tutorial's ranks, untraced): not the
            # rank; it set up again as the rank it joined, removed the rank's directory,
            # and its new one was left without a status, and a SIGTERM handler it had
            # installed was replaced (NEW-1)
            return
        if not self.set_up:
            self.rank, self.world_size = rank, world_size
            self.rank_source = "init_process_group"
            if self.started_by == "reexec":
                self.bind_to_job()
            self.setup()
            return
        if (rank, world_size) == (self.rank, self.world_size):
            return
        if rank != self.rank:
            started = bool(self.tracker is not None and self.tracker.steps_completed) or bool(
                self.profiler is not None and self.profiler.active
            )
            if started:
                self._warn(
                    f"init_process_group made this process rank {rank} of {world_size} "
                    f"after steps were recorded as rank {self.rank}; kept as rank {self.rank}"
                )
                return
            self._stop_recording()
            self.rank, self.world_size = rank, world_size
            self.rank_source = "init_process_group"
            self.setup()
            return
        self.world_size = world_size
        self.rank_source = "init_process_group"
        self.rank_info.update(
            world_size=world_size, rank_source=self.rank_source, init_method=self.init_method
        )
        if self.profiler is not None:
            self.profiler.world_size = world_size
        self._write_rank_info()

    def bind_to_job(self) -> None:
        """Ranks end when their parent (torchrun's agent, the launcher, the rank that
        re-executed the script) dies, and when the launcher dies even if their parent
        lives on."""
        agent.die_with_parent(signal.SIGTERM)
        agent.watch_launcher(lambda: _end_when_launcher_lost(self.rank))

    def _install_collectives(self) -> None:
        from gpudiag.capture.collectives import CollectiveRecorder

        try:
            self.recorder = CollectiveRecorder(self.run_dir, self.rank)
            self.recorder.install()
        except Exception as exc:
            self._warn(f"collective recorder not installed ({type(exc).__name__}: {exc})")
            self.recorder = None
        try:
            from gpudiag.capture.hangdump import install_hang_dump, set_finisher
        except ImportError:
            return
        try:
            install_hang_dump(self.run_dir, self.rank)
            set_finisher(self.finish_on_hang)
        except Exception as exc:
            self._warn(f"hang dump not installed ({type(exc).__name__}: {exc})")

    def _install_steps(self) -> None:
        from gpudiag.capture import api
        from gpudiag.capture.profiling import ProfilerWindow, parse_window
        from gpudiag.capture.steps import StepTracker

        self.tracker = StepTracker(self.run_dir, self.rank, origin_ns=self.start_ns)
        window_text = os.environ.get(ENV_PROFILE_STEPS, "off")
        if window_text != "off" and _profiles_itself(self.target):
            # a profiler the script starts while gpudiag's window has a range open can
            # corrupt memory (capture/profiling.py): give way before anything starts
            self._warn(
                "the script runs torch.profiler itself; gpudiag's profiler window is skipped"
            )
            window_text = "off"
        if window_text != "off":
            self.profiler = ProfilerWindow(
                self.run_dir,
                self.rank,
                self.world_size,
                parse_window(window_text),
                provisional=os.environ.get(ENV_PROFILE_DEFAULT) == "1",
            )
            self.tracker.profiler = self.profiler
            from gpudiag.capture.profiling import watch_for_script_profilers

            watch_for_script_profilers(self.profiler)
        if self.recorder is not None:
            self.tracker.on_step_end.append(self.recorder.on_step_end)
        self.tracker.on_step_end.append(self._note_backend)
        self.tracker.install()
        api.install(self.tracker)

    def _write_rank_info(self) -> None:
        """Never raises for I/O (this also runs in the step hook, inside user code)."""
        try:
            rundir.write_rank_json(self.run_dir, self.rank, rundir.RANK_INFO, self.rank_info)
        except OSError as exc:
            rundir.note_write_problem(
                rundir.rank_dir(self.run_dir, self.rank) / rundir.RANK_INFO, exc
            )

    def _note_backend(self, step: int, t_ns: int) -> None:
        """rank_info.json gets the backend once the process group exists."""
        backend = _backend()
        if backend is not None:
            self.rank_info["backend"] = backend
            self.tracker.on_step_end.remove(self._note_backend)
            self._write_rank_info()

    # ------------------------------------------------------------------ running

    def run_user_code(self) -> Outcome:
        return self.run_callable(self._run_target)

    def _run_target(self) -> Any:
        sys.argv = [self.target.get("script") or self.target["module"], *self.script_args]
        _make_room_for_our_frames()
        if "script" in self.target:
            script = self.target["script"]
            _set_path_head(str(Path(script).resolve().parent))
            # absolute, as python gives a script's __file__ and frames: a script that
            # chdirs still finds itself, and every rank names the same file the same way;
            # sys.argv[0] as the user wrote it, as python and torchrun leave it
            with _argv0_as_given(script):
                return runpy.run_path(
                    os.path.abspath(script), init_globals=MAIN_GLOBALS, run_name="__main__"
                )
        _set_path_head(os.getcwd())
        _check_module_as_python_would(self.target["module"])
        return runpy.run_module(
            self.target["module"], init_globals=MAIN_GLOBALS, run_name="__main__", alter_sys=True
        )

    def run_callable(self, body: Callable[[], Any]) -> Outcome:
        """Run the user's code (the script, or a spawned worker's function) and turn how
        it ended into an Outcome."""
        try:
            return self._run_callable(body)
        except _Terminated:  # SIGTERM right as the script ended, before it was noted
            return Outcome("interrupted", EXIT_SIGTERM, "SIGTERM", "terminated")
        except BaseException as exc:  # noqa: BLE001 - a signal handler's, as the script ended
            return self._decide(exc)
        finally:
            _user_code_running(False)

    def _run_callable(self, body: Callable[[], Any]) -> Outcome:
        _user_code_running(True)
        held = _deliver_held_signals()
        if held is not None:
            _user_code_running(False)
            return held
        try:
            if sigterm_pending():  # arrived during set-up
                raise _Terminated()
            self._kept = body()
        except BaseException as exc:
            _user_code_running(False)
            # The exception's frames hold the script's globals (model, data, process
            # group): keep them. Freeing them is teardown work that os._exit skips anyway,
            # and it took 0.5-1 s of every Ctrl-C (DDP reducer, tensors, loader).
            self._kept = exc
            return self._decide(exc)
        _user_code_running(False)
        return Outcome("ok", 0)

    def _decide(self, exc: BaseException) -> Outcome:
        """The Outcome of the user's code ended by ``exc``, whatever is raised while it is
        decided. A DataLoader's SIGCHLD handler raises "DataLoader worker (pid N) is
        killed by signal: ..." in whatever runs when one of its workers has died, here
        included (issue 28, F9: it escaped, the rank ended with no status): the handler
        is set aside first, and a worker killed by a signal of its own (not the job's
        SIGTERM or Ctrl-C) is the rank's error, with the script's exception as its
        context: that is what the script would have raised one step later."""
        pending = exc
        for _ in range(5):
            try:
                _set_aside_sigchld()
                # the script's own exit or interrupt stays what it was
                mine = not isinstance(pending, Exception) or _loader_worker_killed(pending)
                loader = None if mine else _loader_failure(pending)
                if loader is not None:
                    if loader.__context__ is None:
                        loader.__context__ = pending
                    pending = loader
                return self._outcome_of(pending)
            except BaseException as later:  # noqa: BLE001 - raised by a signal handler
                if (
                    _loader_worker_killed(later)
                    and isinstance(pending, Exception)
                    and not _loader_worker_killed(pending)
                ):
                    if later.__context__ is None:
                        later.__context__ = pending
                    pending = later
        name = type(pending).__name__
        try:
            message = _first_line(pending, name)
        except Exception:  # noqa: BLE001
            message = name
        return Outcome("failed", EXIT_EXCEPTION, name, message)

    def _outcome_of(self, exc: BaseException) -> Outcome:
        if isinstance(exc, SystemExit):
            outcome = _outcome_of_exit(exc)
            interrupt = exc.__context__
            if outcome.status == "failed" and isinstance(interrupt, KeyboardInterrupt):
                # the script's own answer to an interrupt (Lightning: shut down, end the
                # ranks it started, sys.exit(1)): interrupted, with the script's code
                name = "SIGTERM" if isinstance(interrupt, _Terminated) else "KeyboardInterrupt"
                message = f"{outcome.message} while handling {name}"
                return Outcome("interrupted", outcome.exit_code, name, message)
            handled = _handled_signal(exc.__traceback__)
            if outcome.status == "failed" and handled is not None:
                # the script's own signal handler ended it (save, then sys.exit(7)):
                # interrupted by that signal, with the script's exit code
                name = "KeyboardInterrupt" if handled == "SIGINT" else handled
                message = f"{outcome.message} in the script's {handled} handler"
                return Outcome("interrupted", outcome.exit_code, name, message)
            return outcome
        if isinstance(exc, _Terminated):
            ended_by_watchdog = self._ended_by_watchdog(exc)
            if ended_by_watchdog is not None:
                return ended_by_watchdog
            return _outcome_of_exception(
                "interrupted", EXIT_SIGTERM, type(exc), exc, exc.__traceback__
            )
        if isinstance(exc, KeyboardInterrupt):
            # A script's own `raise KeyboardInterrupt` prints its traceback, as python
            # does; a Ctrl-C ends the job quietly (docs/reliability.md: every rank's
            # traceback on one Ctrl-C was noise), as before
            tb = _user_frames(exc.__traceback__)
            if _raised_by_the_script(exc):
                _print_exception(exc, tb)
            return _outcome_of_exception("interrupted", EXIT_SIGINT, type(exc), exc, tb)
        if _loader_worker_terminated(exc):
            # the job's SIGTERM or Ctrl-C reached the DataLoader's workers first: their
            # SIGCHLD handler raised in the rank before its own signal did
            return _outcome_of_exception(
                "interrupted", EXIT_SIGTERM, type(exc), exc, exc.__traceback__
            )
        tb = _user_frames(exc.__traceback__)
        _print_exception(exc, tb)
        ended_by_watchdog = self._ended_by_watchdog(exc)
        if ended_by_watchdog is not None:
            return ended_by_watchdog
        return _outcome_of_exception("failed", EXIT_EXCEPTION, type(exc), exc, tb)

    def _ended_by_watchdog(self, exc: BaseException) -> Outcome | None:
        """A peer error raised because the hang watchdog ended the peer this rank was
        waiting for, or the agent's SIGTERM sent because that peer exited: the rank is
        part of the hang, it did not fail and was not interrupted by the user."""
        error = {"exc_type": type(exc).__name__, "message": safe_str(exc)}
        if not isinstance(exc, _Terminated) and not rundir.is_peer_error(error):
            return None
        from gpudiag.capture.hangdump import hang_decided

        verdict = hang_decided(self.run_dir, self.rank)
        if verdict is None:
            return None
        then = (
            "SIGTERM from the agent"
            if isinstance(exc, _Terminated)
            else f"{type(exc).__name__}: {exc}"
        )
        message = f"ended by gpudiag's hang watchdog: {verdict} (then: {then})"
        return Outcome("hang", EXIT_HANG, "Hang", message[:500])

    # ------------------------------------------------------------------ finishing

    def on_fatal_signal(self, signum: int, frame: Any) -> None:
        """A signal whose default action ends the process: its status first. During
        gpudiag's own finishing it is let be: the process ends in a moment anyway."""
        if _RANK_PID and os.getpid() != _RANK_PID[0]:  # a forked child kept the handler
            set_handler(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self._finish_lock.locked():
            return
        self.finish(_fatal_signal_outcome(signum))

    def watch_signals(self) -> None:
        """A SIGTERM or Ctrl-C the main thread cannot act on (blocked in C) still ends
        this rank, with its status (:mod:`gpudiag.capture.signal_watch`)."""
        from gpudiag.capture.signal_watch import SignalWatch

        self._guard("signal watch", SignalWatch(self._finish_stuck, _handler_is_ours).start)

    def _finish_stuck(self, signum: int) -> None:
        """The signal's handler did not run: the main thread is blocked in C."""
        if self._finish_lock.locked():  # the main thread got to its finish after all
            return
        where = _main_thread_line()
        at = f" at {where}" if where else ""
        if signum == signal.SIGTERM:
            outcome = Outcome("interrupted", EXIT_SIGTERM, "SIGTERM", "terminated")
            why = "its handler could not run there; gpudiag ended the rank, as SIGTERM's default action would"
        elif signum == signal.SIGINT:
            outcome = Outcome("interrupted", EXIT_SIGINT, "KeyboardInterrupt", "interrupted")
            why = "the KeyboardInterrupt could not be raised there; gpudiag ended the rank"
        else:
            outcome = _fatal_signal_outcome(signum)
            why = "gpudiag wrote its status, then it died of the signal"
        outcome.message = f"{outcome.message} while blocked in C code{at} ({why})"[:500]
        outcome.abrupt = True
        self.finish(outcome)

    def finish_on_hang(self, reason: str) -> None:
        """The watchdog's finish request (poller thread; the main thread is blocked in a
        collective): write everything this rank has, then exit."""
        reason = reason.strip() or "no progress"
        self.finish(
            Outcome("hang", EXIT_HANG, "Hang", f"ended by gpudiag's hang watchdog: {reason}"[:500])
        )

    def finish(self, outcome: Outcome) -> None:
        """Write everything, then end the process without interpreter teardown. Called
        once: by the main thread at the end of the script, or by the hang dump's poller
        thread on a hang (then the main thread, if it gets here, waits for the exit)."""
        if _in_forked_child():
            _end_forked_child(outcome)
        if not self._finish_lock.acquire(blocking=False):
            _wait_for_exit()
        try:
            self._finish(outcome)
        except BaseException as exc:  # noqa: BLE001 - a defect of ours, or a handler's raise
            # the status lands whatever went wrong before it; never the interpreter's
            # teardown (a torch profiler still open crashes it with SIGSEGV)
            if not self._status_written:
                self._guard("status.json", lambda: self._write_status(outcome))
            self._warn(f"finishing failed ({type(exc).__name__}: {exc})")
        _end_process(outcome)

    def _finish(self, outcome: Outcome) -> None:
        in_main = threading.current_thread() is threading.main_thread()
        hang = outcome.status == "hang" or outcome.abrupt
        if in_main:
            # A second SIGTERM/Ctrl-C while finishing must not cut the writes short, nor
            # the DataLoader's SIGCHLD handler, which raises in whatever runs when one of
            # its workers ends (they get the job's SIGTERM too).
            set_handler(signal.SIGTERM, signal.SIG_IGN)
            set_handler(signal.SIGINT, signal.SIG_IGN)
            set_handler(signal.SIGCHLD, signal.SIG_DFL)
        timeout = HANG_FINISH_TIMEOUT_S if hang else float(os.environ.get(ENV_FINISH_TIMEOUT, "60"))
        _exit_after(timeout, outcome.exit_code)
        deadline = time.monotonic() + timeout - 2.0
        if self.handed_over or (self.started_by == "reexec" and not self.set_up):
            # its spawned ranks wrote the run, or a re-executed script that never became a
            # rank: only the exit code is ours
            self._guard("atexit handlers", atexit._run_exitfuncs)
            self._guard("flush", _flush_open_files)
            os._exit(outcome.exit_code)
        if not self.set_up:  # a spawned rank that never called init_process_group
            self._guard("set-up", self._setup_at_exit)
        self._guard("rank from the environment", self._note_rank_never_confirmed)
        self._guard("untraced processes", self._note_untraced_processes)
        if not hang:  # on a hang the status goes first anyway
            self._write_early_status(outcome)
        # what interpreter shutdown would do first: wait for the script's own threads
        if not hang:
            self._guard(
                "script threads",
                lambda: _join_user_threads(30.0 if outcome.status == "ok" else 5.0),
            )
            self._guard("child observers", _stop_child_observers)
        collectives: dict[str, Any] | None = None
        if not hang:  # on a hang the tables and status go first: exporting may block
            self._guard("profiler export", self._finish_profiler)
        if self.recorder is not None:
            self._guard("collective dump", self.recorder.close)
            collectives = self._guard("collective summary", self.recorder.summary)
        if self.tracker is not None:
            self._guard("step tracker", self.tracker.uninstall)
            self._guard("step table", self.tracker.close)
        if outcome.abrupt or (hang and not in_main):
            # never export from a signal handler (inside whatever range the script had
            # open) nor from another thread: both crashed torch's profiler
            self._drop_open_profile(
                f"{outcome.exc_type} ended this rank"
                if outcome.abrupt
                else "the hang watchdog ended this rank"
            )
        # the reserve's second half is summary.json's room; status.json is written over
        # its first half's own blocks (no other process can take them first)
        rundir.shrink_reserve(self._reserve, rundir.STATUS_RESERVE_BYTES)
        self._guard("summary.json", lambda: self._write_summary(outcome, collectives))
        self._guard("status.json", lambda: self._write_status(outcome))
        rundir.release_space(self._reserve)  # status.json took it, or it failed anyway
        self._reserve = None
        self._status_written = True
        if hang:
            # the process group and atexit handlers would wait for the hung collective
            if in_main and not outcome.abrupt:
                self._guard("profiler export", self._finish_profiler)
        else:
            # as at interpreter exit: the script's atexit handlers may still use the group
            if self.runs_atexit:
                self._guard("atexit handlers", atexit._run_exitfuncs)
            self._guard("process group", _destroy_process_group)
        self._guard("flush", _flush_open_files)
        if self.reexec_children and outcome.status == "ok":
            self._guard(
                "re-executed ranks",
                lambda: wait_for_children(self.run_dir, self.reexec_children, deadline),
            )
        _end_process(outcome)

    def _note_untraced_processes(self) -> None:
        started = spawn.processes_started()
        if not started or self.handed_over or _in_forked_child():
            return
        if (self.tracker is not None and self.tracker.steps_completed) or _backend():
            return
        if self.rank_info.get("backend"):
            return
        _note_untraced(spawn.untraced_processes_note(started))

    def _note_rank_never_confirmed(self) -> None:
        """RANK / WORLD_SIZE in the environment without torchrun (a rank launched by hand,
        or variables left over in the shell) and a script that never made a process
        group: nothing confirms the rank; a single process with stale variables was
        recorded as rank 3 of 8 without a word (issue 28, eighth probe). Said in the
        record, which keeps the rank the environment gave."""
        if self.started_by != "torchrun" or self.world_size <= 1:
            return
        if "TORCHELASTIC_RUN_ID" in os.environ or self.rank_info.get("backend") or _backend():
            return
        rundir.note_problem(
            f"rank {self.rank} of {self.world_size} came from RANK / WORLD_SIZE in the "
            "environment (not torchrun) and the script never called init_process_group: "
            "if this was one process on its own, those variables were left over in the shell"
        )

    def _drop_open_profile(self, why: str) -> None:
        """On a rank ended from another thread (the hang poller, the signal watch), an
        open profile window is not exported: torch.profiler's stop and export from a
        thread other than the one that profiles crashed the rank with SIGSEGV (seen on
        torch 2.13, gloo)."""
        if self.profiler is None or not self.profiler.active:
            return
        self.profiler.export_error = (
            f"not exported: {why} while its profile window "
            f"{self.profiler.first}-{self.profiler.last} was open"
        )

    def _finish_profiler(self) -> None:
        if self.profiler is None:
            return
        self.profiler.finish()
        if self.profiler.exported is None and self.profiler.export_error is None:
            steps = self.tracker.steps_completed if self.tracker else 0
            window = f"profile window {self.profiler.first}-{self.profiler.last}"
            self.profiler.export_error = (
                f"{window} not reached (the run completed {steps} steps): no trace"
                if steps <= self.profiler.last
                else f"{window} not exported (the run completed {steps} steps: ended while "
                "the trace was being written?): no trace"
            )
            if self.rank == 0:
                self._warn(self.profiler.export_error)

    def _write_summary(self, outcome: Outcome, collectives: dict[str, Any] | None) -> None:
        from gpudiag.capture.summary import build_summary

        profiler = self.profiler
        summary = build_summary(
            self.rank,
            outcome.status,
            self.tracker.stats() if self.tracker else {"count": 0},
            collectives,
            list(profiler.profiled_steps) if profiler else [],
            bool(profiler and profiler.exported),
        )
        rundir.write_rank_json(self.run_dir, self.rank, rundir.SUMMARY, summary)

    def _write_status(self, outcome: Outcome) -> None:
        if self.rank_info.get("backend") is None and (backend := _backend()):
            self.rank_info["backend"] = backend
            self._write_rank_info()
        elif not rundir.lexists(rundir.rank_dir(self.run_dir, self.rank) / rundir.RANK_INFO):
            self._write_rank_info()  # a full disk at set-up: the reserve's freed half
        reserve, self._reserve = self._reserve, None
        status = self._status_document(outcome)
        rundir.write_rank_json(self.run_dir, self.rank, rundir.STATUS, status, reserve)

    def _write_early_status(self, outcome: Outcome) -> None:
        """status.json before the slow, fallible part of finishing (the script's threads,
        the trace export, the tables), marked ``finishing``: a rank killed or crashed there
        (the launcher's grace period ran out on a loaded host) still says how its code
        ended, and that its record may be incomplete. The final status.json replaces it.
        Written without the reserve, which stays for the final one: on a full disk this
        one is simply not written."""
        try:
            status = self._status_document(outcome)
            status["incomplete"] = [*(status["incomplete"] or ()), rundir.ENDED_WHILE_FINISHING]
            status[rundir.STATUS_FINISHING] = True
            rundir.write_rank_json(self.run_dir, self.rank, rundir.STATUS, status)
        except Exception:  # noqa: BLE001 - the final status.json is still to come
            pass

    def _status_document(self, outcome: Outcome) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "status": outcome.status,
            "exit_code": outcome.exit_code,
            "exc_type": outcome.exc_type,
            "message": outcome.message,
            "traceback": _cut_traceback(outcome.traceback),
            "steps_completed": self.tracker.steps_completed if self.tracker else 0,
            "start_ns": self.start_ns,
            "end_ns": time.time_ns(),
            "profile_error": getattr(self.profiler, "export_error", None),
            "incomplete": rundir.write_problems() or None,
        }

    def _guard(self, what: str, func: Any) -> Any:
        try:
            return func()
        except OSError as exc:
            rundir.note_write_problem(rundir.rank_dir(self.run_dir, self.rank), exc, what)
            return None
        except BaseException as exc:
            self._warn(f"{what} failed at exit ({type(exc).__name__}: {exc})")
            return None

    def _warn(self, text: str) -> None:
        _say(f"gpudiag: rank {self.rank}: {text}")


def spawned_worker(index: int, nprocs: int) -> Worker:
    """The Worker of a process started by torch.multiprocessing.spawn (see spawn.py)."""
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or "gpudiag_run").resolve()
    worker = Worker(run_dir, {}, [])
    worker.rank, worker.local_rank, worker.world_size = index, index, nprocs
    worker.started_by = "spawn"
    _claim_process()
    if threading.current_thread() is threading.main_thread():
        # before the script's function, as main() does for a torchrun rank: a SIGTERM
        # before init_process_group is an interrupt with a status; a handler the worker
        # inherited (a fork start method) or installs later is the script's
        take_sigterm()
        hide_own_handlers()
    worker.setup_at_init_process_group()
    return worker


def run_spawned_rank(
    fn: Callable, index: int, nprocs: int, args: tuple, error_file: str | None, forked: bool
) -> None:
    """A worker started by torch.multiprocessing.spawn, as one rank of the run
    (spawn.SpawnedRank calls it in the child). A failure also goes to torch's error file,
    so the parent's ProcessRaisedException still carries the traceback. A worker of the
    fork start method runs no atexit handler, as multiprocessing ends it with os._exit
    (probe 28i, F1: the parent's ran once per rank, an rmtree of its tmpdir among them)."""
    worker = spawned_worker(index, nprocs)
    worker.runs_atexit = not forked
    outcome = worker.run_callable(functools.partial(fn, index, *args))
    if outcome.status == "failed" and error_file and outcome.traceback:
        spawn.write_torch_error_file(error_file, outcome.traceback)
    worker.finish(outcome)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from gpudiag.capture.clock import install_test_shift

    install_test_shift()  # tests only: a skewed host (GPUDIAG_TEST_CLOCK_SHIFT_NS)
    take_sigterm(at_start=True)
    hide_own_handlers()
    target, script_args = parse_target(argv)
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or "gpudiag_run").resolve()
    worker = Worker(run_dir, target, script_args)
    _record_fatal_signals(worker)
    worker.watch_signals()
    reexec = worker.launched_alone and _int_env(ENV_REEXEC) is not None
    if not reexec:  # a re-executed script is bound to the job once it is a rank
        worker.bind_to_job()
    try:
        if reexec:
            # the script re-executed by a traced rank (Lightning's launcher...): a rank
            # of the same run, set up when init_process_group names it (LOCAL_RANK and
            # WORLD_SIZE until then: what such launchers set); one that never calls it
            # (a helper the script runs) records nothing
            worker.started_by = "reexec"
            worker.rank = worker.local_rank = _int_env("LOCAL_RANK") or 0
            worker.world_size = _int_env("WORLD_SIZE") or 1
            worker.setup_at_init_process_group()
        else:
            worker.setup()
    except _Terminated:
        worker.finish(Outcome("interrupted", EXIT_SIGTERM, "SIGTERM", "terminated during set-up"))
    except KeyboardInterrupt:
        worker.finish(Outcome("interrupted", EXIT_SIGINT, "KeyboardInterrupt", "during set-up"))
    except Exception as exc:  # instrumentation must never stop the training itself
        worker._warn(f"instrumentation incomplete ({type(exc).__name__}: {exc})")
    try:
        outcome = worker.run_user_code()
    except BaseException as exc:  # noqa: BLE001 - never the interpreter's teardown
        outcome = Outcome("failed", EXIT_EXCEPTION, type(exc).__name__, f"{exc}"[:500])
    worker.finish(outcome)
