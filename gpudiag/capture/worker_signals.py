"""The rank's signals (part of the worker, :mod:`gpudiag.capture.worker`): SIGTERM
raises in the user's code only (:func:`_on_sigterm`), the fatal signals left at their
default get a status first (:func:`_record_fatal_signals`), a process the rank forks
dies of them as it would without gpudiag (:func:`_forked_child`), and which handlers
were the script's own (:func:`_note_script_handlers`).

The flags and lists here are the process's one copy: read them through this module.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import CodeType
from typing import TYPE_CHECKING, Any

from gpudiag import frames
from gpudiag.capture import deferred_signals, user_signals

if TYPE_CHECKING:
    from gpudiag.capture.worker import Worker

# gpudiag's worker modules: a signal handler or a frame of one of them is gpudiag's, not
# the script's (siblings of this file, named as their __file__ is)
WORKER_FILES = frozenset(
    os.path.join(os.path.dirname(__file__), name)
    for name in (
        "worker.py",
        "worker_signals.py",
        "worker_outcome.py",
        "worker_exit.py",
        "script_run.py",
        "reexec.py",
    )
)


class _Terminated(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler: user code sees an interrupt,
    so its own ``except KeyboardInterrupt`` clean-up runs."""


# SIGTERM interrupts the user's code only. Once it has ended (an exception being turned
# into status.json: the elastic agent sends SIGTERM right when a peer dies, which is
# exactly when a rank is formatting its own "Connection reset by peer") it is noted and
# the rank finishes writing: a status lost there blames the wrong rank.
_SIGTERM_RAISES = False
_SIGTERM_PENDING = False

# What the script sees of gpudiag's own handlers (hide_own_handlers): signal's functions
# as Python has them, for gpudiag's own use.
real_getsignal = signal.getsignal
set_handler = signal.signal
_OWN_HANDLERS: list[Any] = []
# signal -> gpudiag's handler that stands in for the default action: a script (or a
# library's teardown, Lightning's) that puts back the default it read from getsignal
# gets gpudiag's handler back, not a bare default that ends the rank with no status
_DEFAULT_STANDINS: dict[int, Any] = {}


def take_sigterm(at_start: bool = False) -> None:
    """gpudiag's SIGTERM handler in place, standing in for the default, where the
    default is: a handler the process already has (the script's, installed before
    gpudiag set up, e.g. in an mp.spawn worker before its ``init_process_group``, or
    inherited through fork; ``SIG_IGN`` it set) is never replaced. Issue 28, NEW-1:
    a spawned rank sets up at ``init_process_group``, and this replaced the handler the
    worker had installed before it (``getsignal`` then said the default, and the job's
    SIGTERM raised KeyboardInterrupt instead of running the script's checkpoint).
    ``at_start``: the process's start, before any code of the script (``main``); what is
    there then was inherited and is taken, except an ignored SIGTERM (``nohup``, ``trap ''
    TERM``), which stays ignored as under plain python (probe 28j, F4). A SIGTERM held
    since the process started (deferred_signals) is delivered to gpudiag's handler,
    which notes it until the script runs."""
    if at_start:
        if deferred_signals.inherited(signal.SIGTERM) is not signal.SIG_IGN:
            set_handler(signal.SIGTERM, _on_sigterm)
        deferred_signals.release(signal.SIGTERM, _on_sigterm)
    elif real_getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_sigterm):
        set_handler(signal.SIGTERM, _on_sigterm)
    _DEFAULT_STANDINS[signal.SIGTERM] = _on_sigterm


def _on_sigterm(signum: int, frame: Any) -> None:
    global _SIGTERM_PENDING
    if _SIGTERM_RAISES:
        raise _Terminated()
    _SIGTERM_PENDING = True


def sigterm_pending() -> bool:
    """A SIGTERM came while the user's code was not running (during set-up)."""
    return _SIGTERM_PENDING


def _user_code_running(running: bool) -> None:
    global _SIGTERM_RAISES
    _SIGTERM_RAISES = running
    if not running:
        _note_script_handlers()
        _ignore_ctrl_c()


# signals a script handles itself to end the run (its handler saves, then sys.exit): the
# stops and every signal the launcher passes on to the processes that handle it (a
# SIGALRM or SIGXCPU handler's sys.exit(7) was a failure that blamed the rank, probe 28k C)
_ENDING_SIGNALS: tuple[int, ...] = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    *user_signals.PASSED_SIGNALS,
)


def signal_name(signum: int) -> str | None:
    """``SIGALRM``; ``SIGRTMIN+3`` for a real-time signal python's enum has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
        return f"SIGRTMIN+{signum - low}" if low < signum <= high else None


# the code of each handler the script had installed as its code ended -> the signal
_SCRIPT_HANDLERS: dict[CodeType, str] = {}


def _note_script_handlers() -> None:
    """Before gpudiag ignores Ctrl-C for its finishing: which handlers were the script's
    (read by :func:`_handled_signal`)."""
    _SCRIPT_HANDLERS.clear()
    for signum in _ENDING_SIGNALS:
        try:
            handler = real_getsignal(signum)
        except (OSError, ValueError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        name = signal_name(signum)
        if code is not None and name is not None and code.co_filename not in WORKER_FILES:
            _SCRIPT_HANDLERS.setdefault(code, name)


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
            if real_getsignal(signum) is signal.SIG_DFL:
                set_handler(signum, worker.on_fatal_signal)
                _FATAL_HANDLED.append(signum)
                _DEFAULT_STANDINS[signum] = worker.on_fatal_signal
                _OWN_HANDLERS.append(worker.on_fatal_signal)
        except (ValueError, OSError):
            pass


def _forked_child() -> None:
    """A forked child dies of the signals gpudiag handles in the rank as it would have
    without gpudiag: SIGTERM (a multiprocessing child's terminate(): exit -15, no
    ``finally``; before, gpudiag's handler raised in it, tenth probe, A) and the fatal
    ones. A handler the script installed itself is kept."""
    _DEFAULT_STANDINS.clear()
    try:
        if real_getsignal(signal.SIGTERM) is _on_sigterm:
            set_handler(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the child's main thread
        pass
    _default_fatal_signals()


def _default_fatal_signals() -> None:
    """The fatal signals gpudiag took over go back to their default (a handler the
    script installed since stays)."""
    for signum in _FATAL_HANDLED:
        try:
            if _is_own(real_getsignal(signum)):
                set_handler(signum, signal.SIG_DFL)
        except (ValueError, OSError):
            pass


def release_fatal_signals() -> None:
    """In a process that handed its rank over (an mp.spawn parent): it records nothing,
    so it dies of SIGUSR2 & co. as under python, and the launcher, which passes SIGUSR2
    on to the processes that catch it (capture/user_signals), does not count it as one."""
    if threading.current_thread() is threading.main_thread():
        _default_fatal_signals()
        _FATAL_HANDLED.clear()


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
        set_handler(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass


def _handled_signal(tb: Any) -> str | None:
    """The signal whose handler, installed by the script, the traceback passes through
    (``def on_sigint(signum, frame): ...; sys.exit(7)``); None when none does."""
    codes = _SCRIPT_HANDLERS
    while tb is not None and codes:
        code = tb.tb_frame.f_code
        name = codes.get(code)
        if name is not None:
            return _signal_received(tb.tb_frame, code) or name
        tb = tb.tb_next
    return None


def _signal_received(frame: Any, code: CodeType) -> str | None:
    """The signal a handler's frame was called for (its ``signum`` argument): one
    function may handle several signals, and the first one noted is not always it."""
    first = 1 if code.co_varnames[:1] == ("self",) else 0
    if code.co_argcount <= first:
        return None
    value = frame.f_locals.get(code.co_varnames[first])
    if type(value) is not int and not isinstance(value, signal.Signals):
        return None
    return signal_name(value) if int(value) in _ENDING_SIGNALS else None


def _set_aside_sigchld() -> None:
    """SIGCHLD back to its default in the main thread: once the user's code has ended, a
    DataLoader's handler must not raise into gpudiag (:meth:`Worker._decide`)."""
    if threading.current_thread() is threading.main_thread():
        set_handler(signal.SIGCHLD, signal.SIG_DFL)


def _script_getsignal(signalnum: int) -> Any:
    handler = real_getsignal(signalnum)
    return signal.SIG_DFL if _is_own(handler) else handler


def _script_signal(signalnum: int, handler: Any) -> Any:
    if handler is signal.SIG_DFL:
        handler = _DEFAULT_STANDINS.get(signalnum, handler)
    previous = set_handler(signalnum, handler)
    return signal.SIG_DFL if _is_own(previous) else previous


def _is_own(handler: Any) -> bool:
    return handler is _on_sigterm or any(handler == own for own in _OWN_HANDLERS)


def hide_own_handlers() -> None:
    """The script sees the default action where gpudiag's SIGTERM and fatal-signal
    handlers are (``signal.getsignal``, and what ``signal.signal`` returns): a script
    that chains its SIGTERM handler to the previous one called gpudiag's, which ended it
    before its checkpoint, and one that installs its handler only over the default
    never installed it (probe 28f). A handler the script installs replaces gpudiag's,
    as before (its exit is then the script's); the default it puts back (what it read
    before, as Lightning's teardown does) is gpudiag's handler again, which ends the
    rank as the default would, with its status. gpudiag's own code sets handlers with
    :data:`set_handler`."""
    signal.getsignal = _script_getsignal
    signal.signal = _script_signal
