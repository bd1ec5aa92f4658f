"""Launchers that start the other ranks by running the script again (part of the
worker, :mod:`gpudiag.capture.worker`): such a command runs under gpudiag's worker
(:func:`install_reexec_hook`) and the rank that started it waits for them to finish
(:func:`wait_for_children`).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from gpudiag import rundir

# Set by a traced rank for a process that re-executes the traced script (Lightning's
# subprocess launcher and the like, see install_reexec_hook): that rank's pid.
ENV_REEXEC = "GPUDIAG_REEXEC_PARENT"
# How long a rank that re-executed the script and ended ok waits, once it has written
# everything, for those ranks to finish writing theirs (they would get the parent-death
# signal), within the finish timeout. A rank that failed does not wait: a peer blocked
# in a collective notices only when this process's connections close, at its exit; the
# launcher then waits for it (launcher.ORPHAN_WAIT_S).
REEXEC_WAIT_S = 45.0


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
