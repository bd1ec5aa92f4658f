"""`gpudiag` command line: the one layer that parses arguments and picks exit codes.

One module per command (gpudiag/cli/<command>.py), each with ``main(argv) -> int``,
imported statically here. The command modules import only the standard library at
module level: `gpudiag analyze` must start without importing torch, pandas work waits
until a command needs it. Each command parses its own arguments, so `gpudiag trace` can
pass everything after the script name to the script untouched.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from gpudiag.cli import analyze, bench, compare, dashboard, lint, trace, watch, whatif

# name -> (main, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "trace": (trace.main, "run a training script under capture"),
    "watch": (watch.main, "watch a running job: progress, lagging ranks, stuck collectives"),
    "analyze": (analyze.main, "find bottlenecks in a run or traces"),
    "compare": (compare.main, "two runs side by side; --fail-on-regression gates CI"),
    "whatif": (whatif.main, "projected step time of each fix"),
    "dashboard": (dashboard.main, "open the Streamlit dashboard"),
    "lint": (lint.main, "find DP/DDP anti-patterns in code"),
    "bench": (bench.main, "single vs DP vs DDP comparison"),
}


# Commands that analyse in this process and in the processes it starts (the loading pool,
# a LocalCluster's workers, the dashboard's Streamlit server); not ``trace`` and ``bench``,
# whose children are the user's training processes.
_ANALYSING = frozenset({"analyze", "compare", "whatif", "dashboard", "watch"})
_ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_frees_to_the_system() -> None:
    """Arrow (behind pandas' string columns) allocates from mimalloc by default, which
    keeps pages it has freed: the C allocator gives them back. Measured: the peak of
    `analyze` of a 1M-event trace 268 -> 220 MB, of an 8192-rank client 231 -> 213 MiB,
    no slower (docs/cluster.md). A pool the user chose in the environment is kept."""
    os.environ.setdefault(_ARROW_POOL, "system")  # read when pyarrow is imported, here and
    pyarrow = sys.modules.get("pyarrow")  # in every process started from here
    if pyarrow is not None and os.environ[_ARROW_POOL] == "system":  # imported already
        pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def _usage() -> str:
    lines = ["usage: gpudiag <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`gpudiag <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help", "-V", "--version"):
        try:
            return _usage_or_version(argv)
        except BrokenPipeError:  # `gpudiag --help | head -3`
            return _stdout_closed()
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"gpudiag: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    command, _ = COMMANDS[name]
    _paths_printable()
    if name in _ANALYSING:
        arrow_frees_to_the_system()
    stdout_before = _stdout_identity()
    try:
        code = int(command(rest) or 0)
        if sys.stdout is not None:  # here, not at the interpreter's exit, where it cannot be caught
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return _interrupted(name)
    except SystemExit as exc:
        # rich's Console.on_broken_pipe has already pointed stdout at /dev/null
        if exc.code == 1 and _stdout_redirected_to_devnull(stdout_before):
            return 0
        raise
    return code


def _interrupted(name: str) -> int:
    """Ctrl-C before a command handles it (`gpudiag trace` while it starts, before its
    signals are forwarded to the job; `analyze` at any time): one line, no traceback, and
    the process dies of SIGINT as a python program interrupted there does (a shell script
    that runs it stops too). No job has been started: `trace` handles SIGINT from before
    it claims the run directory."""
    print(f"gpudiag {name}: interrupted (Ctrl-C)", file=sys.stderr)
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    return 130  # where SIGINT cannot end the process (it is blocked)


def _usage_or_version(argv: list[str]) -> int:
    if argv and argv[0] in ("-V", "--version"):
        from gpudiag import __version__

        print(f"gpudiag {__version__}")
    else:
        print(_usage())
    sys.stdout.flush()
    return 0 if argv else 2


def _paths_printable() -> None:
    """A path or argument that is not UTF-8 (Python holds its bytes as lone surrogates)
    must not end a command with UnicodeEncodeError: where stdout is strict (a UTF-8
    locale other than C.UTF-8), such characters are printed as ``\\udcNN``, as Python
    prints them on stderr. Under C.UTF-8 (surrogateescape) the bytes go out as they are."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) == "strict":
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass


def _stdout_identity() -> tuple[int, int] | None:
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no stdout, or not a real file
        return None
    return st.st_dev, st.st_ino


def _stdout_redirected_to_devnull(before: tuple[int, int] | None) -> bool:
    now = _stdout_identity()
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return before is not None and now != before and now == (null.st_dev, null.st_ino)


def _stdout_closed() -> int:
    """The reader of stdout went away (`gpudiag analyze RUN | head -1`): end quietly with
    0, like other Unix tools. stdout is pointed at /dev/null so that what is still buffered
    cannot fail again when the interpreter flushes it at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
