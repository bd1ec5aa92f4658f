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
import functools
import os
import re
import runpy
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from gpudiag import frames, rundir
from gpudiag.capture import agent, spawn

ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_PROFILE_STEPS = "GPUDIAG_PROFILE_STEPS"  # "A-B" or "off"
ENV_PROFILE_DEFAULT = "GPUDIAG_PROFILE_DEFAULT"  # "1": window not chosen by the user
ENV_NODE_RANK = "GPUDIAG_NODE_RANK"
ENV_FINISH_TIMEOUT = "GPUDIAG_FINISH_TIMEOUT_S"
# Set by a traced rank for a process that re-executes the traced script (Lightning's
# subprocess launcher and the like, see install_reexec_hook): that rank's pid.
ENV_REEXEC = "GPUDIAG_REEXEC_PARENT"

EXIT_EXCEPTION = 1
EXIT_HANG = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
RANK_RESERVE_BYTES = rundir.RANK_RESERVE_BYTES  # summary.json and status.json, full disk
# status.json keeps the head and the tail of a longer traceback: it must fit in the room
# kept for it (rundir.STATUS_RESERVE_BYTES)
TRACEBACK_KEEP_CHARS = 16000
LAUNCHER_LOST_GRACE_S = 15.0
# How long a rank that re-executed the script and ended ok waits, once it has written
# everything, for those ranks to finish writing theirs (they would get the parent-death
# signal), within the finish timeout. A rank that failed does not wait: a peer blocked
# in a collective notices only when this process's connections close, at its exit; the
# launcher then waits for it (launcher.ORPHAN_WAIT_S).
REEXEC_WAIT_S = 45.0
# A rank ended on a hang finishes from the poller thread: short, since the launcher
# kills what is left after its own grace (launcher.HANG_FLUSH_WAIT_S).
HANG_FINISH_TIMEOUT_S = 15.0


@dataclass
class Outcome:
    status: str  # ok | failed | interrupted | hang
    exit_code: int
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    # ended from another thread while the main thread is blocked in C (signal_watch),
    # or by a signal whose default action ends the process: written like a hang's end,
    # with no export, no atexit handlers, no waiting
    abrupt: bool = False
    # the process then dies of this signal, as it would have without gpudiag
    die_of: int | None = None


class _Terminated(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler: user code sees an interrupt,
    so its own ``except KeyboardInterrupt`` clean-up runs."""


# SIGTERM interrupts the user's code only. Once it has ended (an exception being turned
# into status.json: the elastic agent sends SIGTERM right when a peer dies, which is
# exactly when a rank is formatting its own "Connection reset by peer") it is noted and
# the rank finishes writing: a status lost there blames the wrong rank.
_SIGTERM_RAISES = False
_SIGTERM_PENDING = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _SIGTERM_PENDING
    if _SIGTERM_RAISES:
        raise _Terminated()
    _SIGTERM_PENDING = True


def _user_code_running(running: bool) -> None:
    global _SIGTERM_RAISES
    _SIGTERM_RAISES = running
    if not running:
        _note_script_handlers()
        _ignore_ctrl_c()


# signals a script handles itself to end the run (its handler saves, then sys.exit)
_ENDING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
# the code of each handler the script had installed as its code ended -> the signal
_SCRIPT_HANDLERS: dict[CodeType, str] = {}


def _note_script_handlers() -> None:
    """Before gpudiag ignores Ctrl-C for its finishing: which handlers were the script's
    (read by :func:`_handled_signal`)."""
    _SCRIPT_HANDLERS.clear()
    for name in _ENDING_SIGNALS:
        try:
            handler = signal.getsignal(getattr(signal, name))
        except (AttributeError, ValueError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None and code.co_filename != __file__:
            _SCRIPT_HANDLERS.setdefault(code, name)


def _handler_is_ours(signum: int) -> bool:
    """The handler in place is gpudiag's (SIGTERM, a fatal signal's) or Python's Ctrl-C
    default: the script did not install its own (then what it does is its decision)."""
    try:
        handler = signal.getsignal(signum)
    except (ValueError, OSError):
        return False
    if signum == signal.SIGTERM:
        return handler is _on_sigterm
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return getattr(handler, "__func__", None) is Worker.on_fatal_signal


# Signals whose default action ends the process and that python leaves at that default:
# the rank died without a status.json (sixth probe: SIGUSR2, SIGALRM). gpudiag handles
# those still at the default, writes the status, then dies of the signal.
FATAL_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF")
    if hasattr(signal, name)
)


_FATAL_HANDLED: list[int] = []  # the signals _record_fatal_signals took over
_RANK_PID: list[int] = []  # the rank's process (not a forked DataLoader worker)


def _claim_process() -> None:
    """This process is the rank: a process it forks (a DataLoader worker, the script's
    own os.fork or fork-context multiprocessing) is not (:func:`_forked_child`)."""
    if not _RANK_PID:
        os.register_at_fork(after_in_child=_forked_child)
    _RANK_PID[:] = [os.getpid()]


def _in_forked_child() -> bool:
    return bool(_RANK_PID) and os.getpid() != _RANK_PID[0]


def _record_fatal_signals(worker: Worker) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    _claim_process()
    for signum in FATAL_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, worker.on_fatal_signal)
                _FATAL_HANDLED.append(signum)
        except (ValueError, OSError):
            pass


def _forked_child() -> None:
    """A forked child dies of the signals gpudiag handles in the rank as it would have
    without gpudiag: SIGTERM (a multiprocessing child's terminate(): exit -15, no
    ``finally``; before, gpudiag's handler raised in it, tenth probe, A) and the fatal
    ones. A handler the script installed itself is kept."""
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the child's main thread
        pass
    for signum in _FATAL_HANDLED:
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (ValueError, OSError):
            pass


def _raised_by_the_script(exc: BaseException) -> bool:
    """The exception's innermost frame is a user frame whose line raises it (not a
    signal's KeyboardInterrupt, which lands wherever the interpreter was)."""
    try:
        stack = traceback.extract_tb(exc.__traceback__)
    except Exception:  # noqa: BLE001 - reading the source may fail
        return False
    if not stack:
        return False
    last = stack[-1]
    return frames.is_user_file(last.filename) and (last.line or "").lstrip().startswith("raise")


def _set_path_head(folder: str) -> None:
    """``folder`` first on sys.path, as python puts a script's folder there: in place of
    the entry python put for gpudiag's own module, or before the rest when python was
    started with -P (safe path: it put none)."""
    if sys.flags.safe_path:
        sys.path.insert(0, folder)
    else:
        sys.path[0] = folder


def _note_untraced(line: str) -> None:
    """Said on stderr at once and kept in the rank's record (status.json ``incomplete``:
    `analyze` and the dashboard show it as a warning)."""
    said = bool(rundir.write_problems())  # note_problem says only a process's first
    rundir.note_problem(line)
    if said:
        _say(f"gpudiag: {line}")


def _end_forked_child(outcome: Outcome) -> None:
    """A child the script forked that ran on to the script's end (or raised, or called
    sys.exit) ends as it would under python: its atexit handlers, its streams flushed,
    its own exit code; nothing of the rank's record is its to write (before, it rewrote
    status.json and summary.json: a healthy run reported failed, tenth probe, B)."""
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - a handler's error is the child's, as in python
        pass
    _flush_open_files()
    _end_process(outcome)


def _fatal_signal_outcome(signum: int) -> Outcome:
    name = signal.Signals(signum).name
    return Outcome(
        "interrupted",
        128 + signum,
        name,
        f"ended by {name}, whose default action ends the process (the script set no handler)",
        abrupt=True,
        die_of=signum,
    )


def _end_process(outcome: Outcome) -> None:
    """os._exit with the outcome's code, or death by its signal (as without gpudiag)."""
    if outcome.die_of is not None:
        try:
            signal.signal(outcome.die_of, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [outcome.die_of])
            os.kill(os.getpid(), outcome.die_of)
            time.sleep(1.0)
        except (OSError, ValueError):
            pass
    os._exit(outcome.exit_code)


def _main_thread_line() -> str | None:
    """``file:line in func`` of the main thread's innermost user frame (gpudiag.frames),
    and the library function it is blocked in."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return None
    inner = frame.f_code.co_name
    while frame is not None and not frames.is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return f"{inner}()"
    where = (
        f"{frames.absolute(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
    )
    return where if frame.f_code.co_name == inner else f"{where} (inside {inner}())"


def _ignore_ctrl_c() -> None:
    """Once the user's code has ended, a Ctrl-C must not raise on the way to finish():
    a KeyboardInterrupt there escapes main() and the rank ends with no status.json.
    finish() ignores it anyway (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass


def parse_target(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if not argv:
        raise SystemExit("gpudiag worker: no script or -m module given")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("gpudiag worker: -m needs a module name")
        return {"module": argv[1]}, argv[2:]
    return {"script": argv[0]}, argv[1:]


def _rank_env() -> tuple[int, int, int]:
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("LOCAL_RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
    )


def _torch_versions() -> dict[str, Any]:
    import torch

    versions: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        if torch.cuda.is_available():
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            versions["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    return versions


def _device(local_rank: int) -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{local_rank % max(1, torch.cuda.device_count())}"
    return "cpu"


def _backend() -> str | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:
        pass
    return None


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
        self.rank_info = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node_rank": int(os.environ.get(ENV_NODE_RANK, os.environ.get("GROUP_RANK", "0"))),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "backend": None,
            "device": _device(self.local_rank),
            "versions": _torch_versions(),
            "start_ns": self.start_ns,
            "rank_source": self.rank_source,
            "started_by": self.started_by,
            "init_method": self.init_method,
        }
        if self.started_by == "reexec":
            self.rank_info["parent_pid"] = _int_env(ENV_REEXEC)
        self._take_reserve()  # before anything else of this rank is written
        self._write_rank_info()
        self.set_up = True
        self._install_collectives()
        self._install_steps()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_sigterm)
        if self.launched_alone and self.target:  # gpudiag started this one process
            self._guard("spawn hook", lambda: spawn.install(self.hand_over_rank, run_spawned_rank))
            self._guard("elastic note", lambda: spawn.install_elastic_note(_note_untraced))
            self._guard("process count", spawn.count_processes)
            self._guard(
                "re-exec hook", lambda: install_reexec_hook(self.target, self.reexec_children)
            )
            if self.rank_source == "default":
                self._guard("init_process_group hook", self.setup_at_init_process_group)

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

    def _stop_recording(self) -> None:
        """Undo set-up and remove this rank's directory (nothing of it is kept)."""
        from gpudiag.capture import api
        from gpudiag.capture.hangdump import set_finisher, uninstall_hang_dump

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
        _join_threads("gpudiag-hangdump", 2.0)  # its poller writes under the old rank
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
        if self.handed_over:  # a forked child of a process that spawned its ranks
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
            # chdirs still finds itself, and every rank names the same file the same way
            return runpy.run_path(os.path.abspath(script), run_name="__main__")
        _set_path_head(os.getcwd())
        return runpy.run_module(self.target["module"], run_name="__main__", alter_sys=True)

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
        try:
            if _SIGTERM_PENDING:  # arrived during set-up
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
            signal.signal(signum, signal.SIG_DFL)
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
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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
            self._guard("set-up", self.setup)
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


def _say(text: str) -> None:
    """One line of gpudiag's on the rank's stderr: the process's own (``sys.__stderr__``),
    not an object the script put in sys.stderr (a wrapper that uppercased gpudiag's
    lines, fifth probe F6). Never raises: the script may have closed fd 2, pointed it at
    a read-only file, or set sys.stderr to None."""
    try:
        print(text, file=sys.__stderr__ or sys.stderr, flush=True)
    except BaseException:  # noqa: BLE001 - OSError, ValueError (closed), a signal handler
        pass


_PRINTED: list[int] = []  # the exception whose traceback was printed (once)


def _print_exception(exc: BaseException, tb: Any) -> None:
    """The user's traceback on stderr, as the interpreter would print it, once per
    exception (the outcome may be decided again after a signal handler raised); never
    raises (see :func:`_say`)."""
    if id(exc) in _PRINTED:
        return
    _PRINTED[:] = [id(exc)]
    hook = sys.excepthook
    if hook is not sys.__excepthook__ and callable(hook):
        try:  # the script's own hook prints it, as at interpreter exit (sixth probe)
            hook(type(exc), exc, tb)
            return
        except BaseException:  # noqa: BLE001 - a broken hook: the default print below
            pass
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001 - formatting reads source files
        return
    try:
        if sys.stderr is not None:
            sys.stderr.write(text)
            sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass


def _cut_traceback(text: str | None) -> str | None:
    """A traceback for status.json: its head and its tail when it is longer than
    TRACEBACK_KEEP_CHARS (a deep recursion), so that status.json fits in its reserve."""
    if text is None or len(text) <= TRACEBACK_KEEP_CHARS:
        return text
    head = TRACEBACK_KEEP_CHARS // 8
    tail = TRACEBACK_KEEP_CHARS - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut by gpudiag ...]\n{text[-tail:]}"


# a profiler the script creates (not a record_function it only annotates with)
_PROFILER_CALL = re.compile(r"profiler\.profile\s*\(")
_PROFILER_IMPORT = re.compile(
    r"from\s+torch\.(?:autograd\.)?profiler\s+import\s+(\([^)]*\)|[^\n]*)"
)


def _profiles_itself(target: dict[str, str]) -> bool:
    """The script's own source (its module's for ``-m``) creates a torch profiler: read,
    never imported; an unreadable file is taken as not profiling."""
    path = target.get("script")
    if path is None and target.get("module"):
        try:
            from importlib.util import find_spec

            spec = find_spec(target["module"])
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None else None
    if path and os.path.isdir(path):  # `python pkgdir` runs pkgdir/__main__.py
        path = os.path.join(path, "__main__.py")
    text = rundir.read_text(path, max_bytes=8 << 20) if path else None
    if not text:
        return False
    if _PROFILER_CALL.search(text):
        return True
    if any(re.search(r"\bprofile\b", m[1]) for m in _PROFILER_IMPORT.finditer(text)):
        return True
    # the profiler module under another name: `from torch import profiler as P`,
    # `import torch.profiler as tp` (ninth probe: missed, and the job crashed), then
    # `P.profile(` / `tp.profile(`
    aliases = {m["alias"] or m["alias2"] for m in _PROFILER_MODULE_ALIAS.finditer(text)}
    return any(re.search(rf"\b{re.escape(a)}\.profile\s*\(", text) for a in aliases)


_PROFILER_MODULE_ALIAS = re.compile(
    r"(?:from\s+torch(?:\.autograd)?\s+import\s+[^\n]*?\bprofiler\s+as\s+(?P<alias>\w+)"
    r"|import\s+torch(?:\.autograd)?\.profiler\s+as\s+(?P<alias2>\w+))"
)


# frames above _run_target's stack until the script's module runs (runpy's run_path,
# _run_module_code, _run_code, and two more the limit counts there: measured, a script
# then recurses exactly as deep as under plain python, 998 frames at the default limit)
_RUNPY_FRAMES = 5


def _make_room_for_our_frames() -> None:
    """Raise the recursion limit by the frames gpudiag and runpy put under the script's
    module: under plain python the module is the first frame, and a script recursing
    to within a few frames of the limit ran out 13 frames early (sixth probe)."""
    depth = 0
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    try:
        sys.setrecursionlimit(sys.getrecursionlimit() + depth + _RUNPY_FRAMES)
    except (RecursionError, ValueError):
        pass


def _exit_status(code: int) -> int:
    """The status the OS reports for ``sys.exit(code)``: python passes a C long to exit(),
    -1 when it does not fit (2**70: 255), and the OS keeps the low byte (256: 0)."""
    if not -(2**63) <= code < 2**63:
        return 255
    return code & 0xFF


def _short(code: int) -> str:
    """The code as written, or its size (str() of a huge int raises ValueError)."""
    return str(code) if code.bit_length() <= 100 else f"<an integer of {code.bit_length()} bits>"


def safe_str(exc: BaseException) -> str:
    """str(exc), or python's own words when the exception's __str__ raises."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - the script's __str__
        return "<exception str() failed>"


def _first_line(exc: BaseException, default: str) -> str:
    text = safe_str(exc)
    if not text:
        return default
    # the first line that says something: torch's ChildFailedError opens with a blank
    # line and a rule of '=' (eighth probe: a script that runs torchrun's main itself)
    lines = [ln for ln in text.splitlines() if any(ch.isalnum() for ch in ln)] or [text]
    first = lines[0].strip()
    # torch's ExceptionWrapper: "Caught IndexError in DataLoader worker process 0." and
    # the worker's traceback; its last line is the error itself
    if first.startswith("Caught ") and len(lines) > 1 and lines[1].startswith("Original Traceback"):
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        first = f"{first.rstrip('.')}: {last}"
    return first[:500]


def _outcome_of_exit(exc: SystemExit) -> Outcome:
    code = exc.code
    if code is None:
        return Outcome("ok", 0)
    if isinstance(code, int):
        status = _exit_status(code)
        if status == 0:  # sys.exit(256) ends a process with 0, as python and torchrun say
            return Outcome("ok", 0)
        return Outcome("failed", status, "SystemExit", f"sys.exit({_short(code)})")
    _say(str(code))  # what the interpreter would do with sys.exit("text")
    return Outcome("failed", 1, "SystemExit", str(code))


def _handled_signal(tb: Any) -> str | None:
    """The signal whose handler, installed by the script, the traceback passes through
    (``def on_sigint(signum, frame): ...; sys.exit(7)``); None when none does."""
    codes = _SCRIPT_HANDLERS
    while tb is not None and codes:
        name = codes.get(tb.tb_frame.f_code)
        if name is not None:
            return name
        tb = tb.tb_next
    return None


def _user_frames(tb: Any) -> Any:
    """Drop gpudiag's and runpy's frames from the top, as a plain `python script.py`
    traceback would not show them."""
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename != __file__ and filename != runpy.__file__ and not filename.startswith("<"):
            break
        tb = tb.tb_next
    return tb


def _outcome_of_exception(status: str, code: int, exc_type: Any, exc: Any, tb: Any) -> Outcome:
    name = "SIGTERM" if exc_type is _Terminated else exc_type.__name__
    if exc_type is _Terminated:
        # where the user's code was when the signal came, without gpudiag's handler
        frames = [f for f in traceback.extract_tb(_user_frames(tb)) if f.filename != __file__]
        text = "Traceback (most recent call last):\n"
        text += "".join(traceback.format_list(frames)) + "SIGTERM\n"
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
    return Outcome(status, code, name, _first_line(exc, name), text)


def _wait_for_exit() -> None:
    """Another thread is finishing this process and ends it with os._exit."""
    while True:
        try:
            time.sleep(1.0)
        except BaseException:  # noqa: BLE001 - a second SIGTERM/Ctrl-C: keep waiting
            continue


def _join_user_threads(limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    for thread in threading.enumerate():
        if (
            thread is threading.current_thread()
            or thread is threading.main_thread()
            or thread.daemon
            or not thread.is_alive()
        ):
            continue
        thread.join(max(0.0, deadline - time.monotonic()))


def _stop_child_observers() -> None:
    """Lightning's ``_ChildProcessObserver``, a daemon thread of the process that started
    the other ranks, SIGKILLs its own process within 5 s of a child rank ending non-zero
    (as Lightning's Ctrl-C answer does to them). Under plain python the interpreter exits
    right after the script's threads are joined, and the daemon thread with it; gpudiag's
    finishing (trace export, tables, status) then still runs, and the observer killed it
    midway (issue 28, fourth probe F4). Its check is ended here, at the point where
    python would have exited."""
    for thread in threading.enumerate():
        if type(thread).__name__ == "_ChildProcessObserver" and thread.daemon:
            thread._run = lambda: True  # type: ignore[attr-defined]
            thread._finished = True  # type: ignore[attr-defined]


def _flush_open_files() -> None:
    """os._exit skips the flush that closing file objects at teardown would do: flush
    every open writable file object of the script (logs, CSV writers...) ourselves."""
    import _io
    import gc

    # type(), not isinstance(): isinstance reads __class__, which some objects warn on.
    # _io._IOBase (the C base of every io class, io.IOBase included), not the io.IOBase
    # ABC: an ABC subclass check per object took 1-1.5 s over a torch process's objects.
    base = _io._IOBase
    for obj in gc.get_objects():
        if issubclass(type(obj), base) and not obj.closed:
            try:
                if obj.writable():
                    obj.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a stream the script broke (closed fd, None)
            pass


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_LOADER_TERMINATED = re.compile(
    r"DataLoader worker \(pid \d+\) is killed by signal: (Terminated|Interrupt)"
)


_LOADER_KILLED = re.compile(
    r"DataLoader worker \(pid \d+\) (is killed by signal|exited unexpectedly)"
)


def _loader_worker_terminated(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and bool(_LOADER_TERMINATED.search(safe_str(exc)))


def _loader_worker_killed(exc: BaseException) -> bool:
    """A DataLoader's error for a worker that died of its own (SIGKILL from the OOM
    killer, a segfault), not of the job's SIGTERM or Ctrl-C."""
    return (
        isinstance(exc, RuntimeError)
        and bool(_LOADER_KILLED.search(safe_str(exc)))
        and not _loader_worker_terminated(exc)
    )


def _set_aside_sigchld() -> None:
    """SIGCHLD back to its default in the main thread: once the user's code has ended, a
    DataLoader's handler must not raise into gpudiag (:meth:`Worker._decide`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _loader_failure(exc: BaseException) -> BaseException | None:
    """The DataLoader's own error for a worker of this process that was killed by a
    signal (torch's check, the one its SIGCHLD handler makes), or None. Only when torch
    is loaded already; a worker ended by the job's SIGTERM or Ctrl-C is not one. torch's
    check sees only a worker that is a zombie already; otherwise the exit codes of the
    workers of the DataLoader iterator the script's exception ``exc`` came through tell
    (:func:`_reaped_loader_worker_killed`)."""
    module = sys.modules.get("torch.utils.data._utils.signal_handling")
    check = getattr(module, "_error_if_any_worker_fails", None)
    if check is None:
        return None
    try:
        check()
    except RuntimeError as error:
        return error if _loader_worker_killed(error) else None
    except Exception:  # noqa: BLE001 - never gpudiag's problem
        return None
    return _reaped_loader_worker_killed(exc)


LOADER_DEATH_WAIT_S = 2.0


def _reaped_loader_worker_killed(exc: BaseException) -> RuntimeError | None:
    """torch's error for a DataLoader worker killed by a signal of its own, from the
    exit codes of the workers of the iterators in ``exc``'s traceback. The script's
    ConnectionResetError or EOFError can come before the worker is a zombie (the kernel
    closes a dying process's sockets first; torch's check then found nothing, and under
    load the rank's error was the ConnectionResetError): then wait a little for it."""
    workers = _loader_workers_in(exc)
    if not workers:
        return None
    # OSError: also the FileNotFoundError of torch's resource sharer, connecting to a
    # worker that has just exited (eighth probe: sys.exit(3) in a worker)
    deadline = time.monotonic() + (
        LOADER_DEATH_WAIT_S if isinstance(exc, (OSError, EOFError)) else 0.0
    )
    while True:
        for worker in workers:
            code = getattr(worker, "exitcode", None)
            if isinstance(code, int) and code < 0:
                error = RuntimeError(
                    f"DataLoader worker (pid {worker.pid}) is killed by signal: "
                    f"{signal.strsignal(-code)}. "
                )
                return error if _loader_worker_killed(error) else None
            if isinstance(code, int) and code > 0:  # torch's words for it
                return RuntimeError(
                    f"DataLoader worker (pid {worker.pid}) exited unexpectedly with exit "
                    f"code {code}. "
                )
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _loader_workers_in(exc: BaseException) -> list[Any]:
    """The worker processes of the DataLoader iterators ``exc`` was raised through."""
    workers: list[Any] = []
    seen: set[int] = set()
    tb = exc.__traceback__
    while tb is not None:
        it = tb.tb_frame.f_locals.get("self")
        tb = tb.tb_next
        found = getattr(it, "_workers", None)
        if id(it) not in seen and isinstance(found, list):
            seen.add(id(it))
            workers += found
    return workers


def _exit_after(seconds: float, code: int) -> None:
    """If finishing hangs (a collective that never returns, a stuck atexit handler), end
    the process anyway."""

    def _expire() -> None:
        _say(f"gpudiag: finishing took over {seconds:.0f} s; exiting")
        os._exit(code)

    timer = threading.Timer(seconds, _expire)
    timer.daemon = True
    timer.start()


def _end_when_launcher_lost(rank: int) -> None:
    """The launcher is gone (SIGKILL, OOM): end this rank as if it had been sent SIGTERM
    (flush, status.json, exit 143); if the main thread cannot take the signal (blocked
    in a collective whose peer also went away), exit after a grace period."""
    _say(f"gpudiag: rank {rank}: the launcher is gone; ending this rank")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(LAUNCHER_LOST_GRACE_S)
    os._exit(EXIT_SIGTERM)


# --------------------------------------------------------------------------- re-exec
# Launchers that start the other ranks by running the script again (Lightning's
# _SubprocessScriptLauncher: ``sys.executable /abs/script.py args`` with LOCAL_RANK,
# WORLD_SIZE... in the environment; the same for ``-m module``): in a process gpudiag
# started alone, such a command is run under gpudiag's worker instead, and the child
# becomes a rank of the same run once its init_process_group names its rank.

_PYTHON_NAME = re.compile(r"python[0-9.]*(?:\.exe)?$")
_PYTHON_FLAGS_WITH_VALUE = ("-W", "-X")
WORKER_MODULE = "gpudiag.capture.rank"


def reexec_command(command: Any, target: dict[str, str], cwd: Any = None) -> list[str] | None:
    """``command`` run under gpudiag's worker when it runs the traced ``target`` (the
    same script file, or ``-m`` the same module) with a Python interpreter; None for any
    other command (a shell string, another script, ``-c``, gpudiag's own worker)."""
    if isinstance(command, (str, bytes)) or not isinstance(command, (list, tuple)):
        return None
    if not command:
        return None
    argv = [os.fsdecode(a) for a in command]
    if not _is_python(argv[0]):
        return None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-"):
        if argv[i] == "-c" or argv[i].startswith("-c"):
            return None
        i += 2 if argv[i] in _PYTHON_FLAGS_WITH_VALUE else 1
    if i >= len(argv):
        return None
    if argv[i] == "-m":
        if i + 1 >= len(argv) or argv[i + 1] != target.get("module"):
            return None
    elif "script" not in target or not _same_file(argv[i], target["script"], cwd):
        return None
    return [*argv[:i], "-m", WORKER_MODULE, *argv[i:]]


def _is_python(executable: str) -> bool:
    if os.path.basename(executable) == os.path.basename(sys.executable):
        return True
    try:
        if os.path.realpath(executable) == os.path.realpath(sys.executable):
            return True
    except (OSError, ValueError):
        pass
    return bool(_PYTHON_NAME.search(os.path.basename(executable)))


def _same_file(path: str, script: str, cwd: Any) -> bool:
    try:
        base = os.fsdecode(cwd) if cwd is not None else os.getcwd()
        return os.path.samefile(os.path.join(base, path), script)
    except (OSError, TypeError, ValueError):
        return False


def install_reexec_hook(target: dict[str, str], children: list[Any]) -> None:
    """Patch ``subprocess.Popen`` so that a command re-executing the traced script runs
    under gpudiag's worker (:func:`reexec_command`), with this process's gpudiag
    environment and :data:`ENV_REEXEC`; each such Popen is appended to ``children``.
    Any other command is started untouched; the patch never raises into the caller."""
    import inspect
    import subprocess

    original = subprocess.Popen.__init__
    if getattr(original, "_gpudiag_wrapped", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        bound = None
        try:
            bound = _reexec_arguments(signature, self, args, kwargs, target)
        except Exception:  # noqa: BLE001 - never the script's problem
            bound = None
        if bound is None:
            original(self, *args, **kwargs)
            return
        original(*bound.args, **bound.kwargs)
        children.append(self)

    __init__._gpudiag_wrapped = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]


def _reexec_arguments(
    signature: Any, popen: Any, args: tuple, kwargs: dict[str, Any], target: dict[str, str]
) -> Any:
    """Popen's bound arguments rewritten for a re-executed rank, or None."""
    bound = signature.bind(popen, *args, **kwargs)
    given = bound.arguments
    if given.get("shell") or given.get("executable") is not None:
        return None
    command = reexec_command(given.get("args"), target, given.get("cwd"))
    if command is None:
        return None
    env = given.get("env")
    env = dict(os.environ if env is None else env)
    for key, value in os.environ.items():  # the run directory, the profile window...
        if key.startswith("GPUDIAG_"):
            env.setdefault(key, value)
    env[ENV_REEXEC] = str(os.getpid())
    given["args"] = command
    given["env"] = env
    return bound


def wait_for_children(run_dir: Path, children: list[Any], deadline: float) -> None:
    """Before this rank's process ends ok (its re-executed ranks would get the
    parent-death signal): wait for those that became ranks to finish, until
    REEXEC_WAIT_S or ``deadline`` (time.monotonic()); those still running then end with
    this process. A re-executed script that is no rank (a helper) is not waited for."""
    pids = set()
    for rank in rundir.list_ranks(run_dir):
        info = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.RANK_INFO)
        if isinstance(info, dict) and isinstance(info.get("pid"), int):
            pids.add(info["pid"])
    until = min(deadline, time.monotonic() + REEXEC_WAIT_S)
    for child in children:
        if child.pid not in pids:
            continue
        try:
            child.wait(timeout=max(0.0, until - time.monotonic()))
        except Exception:  # noqa: BLE001 - TimeoutExpired: it ends with this process
            pass


def _join_threads(name: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    for thread in threading.enumerate():
        if thread.name == name and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _init_method(args: tuple, kwargs: dict[str, Any]) -> str | None:
    """init_process_group's rendezvous: its ``init_method`` (``tcp://A:P``,
    ``file://...``), ``store`` when given a store, else ``env://MASTER_ADDR:MASTER_PORT``."""
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if isinstance(method, str) and method and method != "env://":
        return method[:500]
    if kwargs.get("store") is not None or (len(args) > 5 and args[5] is not None):
        return "store"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"env://{addr}:{port}"[:500]
    return None


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return None


def spawned_worker(index: int, nprocs: int) -> Worker:
    """The Worker of a process started by torch.multiprocessing.spawn (see spawn.py)."""
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or "gpudiag_run").resolve()
    worker = Worker(run_dir, {}, [])
    worker.rank, worker.local_rank, worker.world_size = index, index, nprocs
    worker.started_by = "spawn"
    _claim_process()
    worker.setup_at_init_process_group()
    return worker


def run_spawned_rank(
    fn: Callable, index: int, nprocs: int, args: tuple, error_file: str | None
) -> None:
    """A worker started by torch.multiprocessing.spawn, as one rank of the run
    (spawn.SpawnedRank calls it in the child). A failure also goes to torch's error file,
    so the parent's ProcessRaisedException still carries the traceback."""
    worker = spawned_worker(index, nprocs)
    outcome = worker.run_callable(functools.partial(fn, index, *args))
    if outcome.status == "failed" and error_file and outcome.traceback:
        spawn.write_torch_error_file(error_file, outcome.traceback)
    worker.finish(outcome)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from gpudiag.capture.clock import install_test_shift

    install_test_shift()  # tests only: a skewed host (GPUDIAG_TEST_CLOCK_SHIFT_NS)
    signal.signal(signal.SIGTERM, _on_sigterm)
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
