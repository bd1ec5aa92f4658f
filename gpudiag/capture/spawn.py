"""Scripts that start their own workers with ``torch.multiprocessing.spawn`` (or
``start_processes``): each spawned worker becomes a rank of the run.

``gpudiag trace script.py`` (no torchrun) runs the script in one worker process, which
would be rank 0 of a world of one. :func:`install` patches torch.multiprocessing there.
When the script spawns, that process hands its rank over (its rank directory is
removed; it records nothing more but keeps the job's exit code), and every child runs
the script's function through :class:`SpawnedRank`: it learns its rank and world size
when it calls ``init_process_group`` (until then the spawn index is assumed), sets up
gpudiag's recording like a torchrun worker, and ends with status.json and ``os._exit``
like one. A child that raises writes torch's own error file too, so the parent's
``ProcessRaisedException`` still carries the traceback.
"""

from __future__ import annotations

import functools
import pickle
import sys
from collections.abc import Callable
from typing import Any

_STARTED = False


# run_rank(fn, index, nprocs, args, error_file): a spawned worker's whole life as a rank
# (worker.run_spawned_rank). Passed in, not imported, so that worker.py, which installs
# this hook, and this module do not import each other; it must be a module-level
# function, as it is pickled into every child.
# ``forked``: the fork or forkserver start method, whose workers end with os._exit
RankRunner = Callable[[Callable, int, int, tuple, "str | None", bool], None]
FORKING_METHODS = ("fork", "forkserver")


def install(on_spawn: Callable[[], None], run_rank: RankRunner) -> None:
    """Patch torch.multiprocessing's start_processes (spawn() goes through it) in the
    process gpudiag started; ``on_spawn`` runs once, before the first worker starts, and
    each worker runs the user's function through ``run_rank``."""
    import torch.multiprocessing as tmp

    module = sys.modules.get("torch.multiprocessing.spawn")
    original = getattr(module, "start_processes", None)
    if original is None or getattr(original, "_gpudiag_wrapped", False):
        return

    @functools.wraps(original)
    def start_processes(fn: Callable, args: tuple = (), nprocs: int = 1, *rest: Any, **kw: Any):
        global _STARTED
        if not _STARTED:
            _STARTED = True
            on_spawn()
        method = kw.get("start_method", rest[2] if len(rest) > 2 else "spawn")
        rank = SpawnedRank(fn, nprocs, run_rank, method in FORKING_METHODS)
        return original(rank, args, nprocs, *rest, **kw)

    start_processes._gpudiag_wrapped = True  # type: ignore[attr-defined]
    module.start_processes = start_processes  # type: ignore[union-attr]
    tmp.start_processes = start_processes


def watch_exits(record: Callable[[Any], None]) -> None:
    """Patch torch's ``ProcessContext.join`` in the spawn parent: when a worker ended
    with a non-zero exit and no error of its own (SIGKILL, the OOM killer,
    ``os._exit(3)``), torch names it in ``ProcessExitedException`` after it has
    SIGTERMed the others; ``record(process)`` is given that first worker. Only this
    parent knows how its workers ended (probe 28i, F6: the peer torch terminated was
    blamed "from outside the job")."""
    module = sys.modules.get("torch.multiprocessing.spawn")
    context = getattr(module, "ProcessContext", None)
    exited = getattr(module, "ProcessExitedException", None)
    original = getattr(context, "join", None)
    if original is None or exited is None or getattr(original, "_gpudiag_wrapped", False):
        return

    @functools.wraps(original)
    def join(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except exited as exc:
            try:
                record(self.processes[exc.error_index])
            except Exception:  # noqa: BLE001 - the record must never change the job's end
                pass
            raise

    join._gpudiag_wrapped = True  # type: ignore[attr-defined]
    context.join = join  # type: ignore[union-attr]


class SpawnedRank:
    """Picklable wrapper of the user's function: runs it as one rank of the run."""

    def __init__(self, fn: Callable, nprocs: int, run_rank: RankRunner, forked: bool) -> None:
        self.fn = fn
        self.nprocs = nprocs
        self.run_rank = run_rank
        self.forked = forked

    def __call__(self, index: int, *args: Any) -> None:
        error_file = _torch_error_file(sys._getframe(1))
        self.run_rank(self.fn, index, self.nprocs, args, error_file, self.forked)


def _torch_error_file(frame: Any) -> str | None:
    """torch.multiprocessing.spawn._wrap(fn, i, args, error_file) called us."""
    value = frame.f_locals.get("error_file") if frame is not None else None
    return value if isinstance(value, str) else None


def write_torch_error_file(path: str, text: str) -> None:
    """What torch's _wrap writes for the parent: a pickled traceback string (torch reads
    it in the parent; gpudiag never reads it)."""
    try:
        with open(path, "wb") as fh:
            pickle.dump(text, fh)
    except OSError:
        pass


def restore_collectives(recorder: Any) -> None:
    """Undo a recorder's patches of torch.distributed (the parent hands its rank over)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, original in getattr(recorder, "_originals", {}).items():
        wrapper = getattr(c10d, name, None)
        setattr(c10d, name, original)
        if getattr(dist, name, None) is wrapper:
            setattr(dist, name, original)


# --------------------------------------------------------------------------- elastic


def untraced_elastic_note(nprocs: int | None) -> str:
    n = str(nprocs) if nprocs else "N"
    return (
        f"the script starts {n} worker(s) with torch's elastic launcher inside its own "
        "process (torch.distributed.run.main / elastic_launch): they run untraced; trace "
        f"them with `gpudiag trace --nproc-per-node {n} <their script>`"
    )


def install_elastic_note(note: Callable[[str], None]) -> None:
    """Patch torch's elastic ``launch_agent`` (torchrun's ``main`` and ``elastic_launch``
    reach it) in the process gpudiag started: the workers it starts for a command (a
    script, torchrun's way) are not gpudiag's to trace, and the record said nothing of
    them (issue 28). ``note`` is given the one line that says so, once, before they
    start; the launch itself is untouched. Workers of a function (accelerate's
    notebook_launcher) start through torch.multiprocessing and are followed as
    mp.spawn's: no note (probe 28g, N6: "they run untraced" of traced ranks)."""
    try:
        from torch.distributed.launcher import api
    except ImportError:  # a torch without torch.distributed
        return
    original = getattr(api, "launch_agent", None)
    if original is None or getattr(original, "_gpudiag_wrapped", False):
        return

    @functools.wraps(original)
    def launch_agent(*args: Any, **kwargs: Any) -> Any:
        # whatever torch's signature is (it grew keywords): passed on untouched
        try:
            config = kwargs.get("config", args[0] if args else None)
            entrypoint = kwargs.get("entrypoint", args[1] if len(args) > 1 else None)
            if not callable(entrypoint):
                note(untraced_elastic_note(getattr(config, "nproc_per_node", None)))
        except Exception:  # noqa: BLE001 - saying so must never stop the launch
            pass
        return original(*args, **kwargs)

    launch_agent._gpudiag_wrapped = True  # type: ignore[attr-defined]
    api.launch_agent = launch_agent


# --------------------------------------------------------------------------- multiprocessing

_PROCESSES_STARTED = [0]
# processes that are helpers, never ranks: DataLoader workers, Pool and executor workers
_HELPER_MODULES = ("torch.utils.data", "multiprocessing.", "concurrent.futures")


def processes_started() -> int:
    """How many multiprocessing processes the script started in this process."""
    return _PROCESSES_STARTED[0]


def count_processes() -> None:
    """Count the multiprocessing ``Process`` starts of the process gpudiag started (the
    tutorial's ranks, ``mp.Process(target=init_process, ...)``, run untraced, and the
    record said nothing of them: eleventh probe of issue 28, D). The count is said only
    when this process itself trained nothing; DataLoader, Pool and executor workers are
    helpers, not counted."""
    import multiprocessing.process as mp_process

    original = mp_process.BaseProcess.start
    if getattr(original, "_gpudiag_wrapped", False):
        return

    @functools.wraps(original)
    def start(self: Any) -> None:
        target = getattr(getattr(self, "_target", None), "__module__", None) or ""
        if not target.startswith(_HELPER_MODULES):
            _PROCESSES_STARTED[0] += 1
        original(self)

    start._gpudiag_wrapped = True  # type: ignore[attr-defined]
    mp_process.BaseProcess.start = start  # type: ignore[method-assign]


def untraced_processes_note(count: int) -> str:
    return (
        f"the script started {count} process(es) with multiprocessing and trained nothing "
        "in its own process: if those processes are its ranks (init_process_group in "
        "each), they ran untraced; start them with `gpudiag trace --nproc-per-node N` "
        "(torchrun-style) or torch.multiprocessing.spawn, which gpudiag follows"
    )
