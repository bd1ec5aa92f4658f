"""How the user's code ended, as an :class:`Outcome` (part of the worker,
:mod:`gpudiag.capture.worker`): sys.exit codes, exceptions and their traceback for
status.json, a DataLoader worker killed under the script, and gpudiag's own lines on
the rank's stderr (:func:`_say`).
"""

from __future__ import annotations

import os
import re
import runpy
import signal
import sys
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

from gpudiag import frames
from gpudiag.capture.worker_signals import WORKER_FILES, _Terminated

EXIT_EXCEPTION = 1
EXIT_HANG = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
# status.json keeps the head and the tail of a longer traceback: it must fit in the room
# kept for it (rundir.STATUS_RESERVE_BYTES)
TRACEBACK_KEEP_CHARS = 16000


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
    try:  # the interpreter's own print shows the exception's traceback, not ``tb``
        exc.__traceback__ = tb
    except BaseException:  # noqa: BLE001 - an exception type that refuses it
        pass
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


def _user_frames(tb: Any) -> Any:
    """Drop gpudiag's and runpy's frames from the top, as a plain `python script.py`
    traceback would not show them, and gpudiag's wrappers from the middle (its
    DistributedDataParallel.forward around DDP's own) when the error is not gpudiag's:
    the rank's traceback reads as it would under torchrun (probe 28c, defect 5)."""
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if (
            filename not in WORKER_FILES
            and filename != runpy.__file__
            and not filename.startswith("<")
        ):
            break
        tb = tb.tb_next
    return _without_capture_frames(tb)


_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_capture_frame(tb: types.TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(_CAPTURE_DIR)


def _without_capture_frames(tb: Any) -> Any:
    frames: list[types.TracebackType] = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if not frames or _is_capture_frame(frames[-1]):
        return frames[0] if frames else None  # raised in gpudiag: every frame tells
    kept = [frame for frame in frames if not _is_capture_frame(frame)]
    if len(kept) == len(frames):
        return frames[0]
    rebuilt = None
    for frame in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def _outcome_of_exception(status: str, code: int, exc_type: Any, exc: Any, tb: Any) -> Outcome:
    name = "SIGTERM" if exc_type is _Terminated else exc_type.__name__
    if exc_type is _Terminated:
        # where the user's code was when the signal came, without gpudiag's handler
        frames = [
            f for f in traceback.extract_tb(_user_frames(tb)) if f.filename not in WORKER_FILES
        ]
        text = "Traceback (most recent call last):\n"
        text += "".join(traceback.format_list(frames)) + "SIGTERM\n"
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
    return Outcome(status, code, name, _first_line(exc, name), text)


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
