"""``python -m gpudiag.capture.agent [torchrun options] -m gpudiag.capture.rank ...``:
torch.distributed.run as ``gpudiag trace`` starts it.

The same elastic agent as ``torchrun``, with three differences:

- it ends when the launcher dies (parent-death signal, :func:`die_with_parent`), and the
  agent then ends its workers, so a SIGKILLed ``gpudiag trace`` leaves no orphans;
- a Ctrl-C or SIGTERM that the launcher forwards ends it with 128 + the signal and no
  Python traceback (torchrun prints its ``SignalException``; gpudiag reports the
  interrupt itself);
- it ends with ``os._exit`` once the agent has returned: the interpreter teardown of a
  process that imported torch's elastic stack took 2-3 s on the 2-core machines, which
  made every Ctrl-C take 3-4 s;
- a signal that ends the agent is written to ``node<N>/agent_failures.json``
  (``signal``): the launcher tells its own forwarded signal from one sent to the agent
  from outside (probe 28d: SIGTERM to the agent blamed an arbitrary rank);
- when workers fail, the agent's own record of each one (exit code or signal, pid,
  local rank) is written to ``node<N>/agent_failures.json``: the only place a rank that
  died without writing its status (SIGKILL from the OOM killer, a segfault, a native
  abort) is known by its signal (read by :mod:`gpudiag.capture.blame`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import time
from typing import Any

from gpudiag.capture import deferred_signals, threads

AGENT_FAILURES = "agent_failures.json"
SPAWN_PARENT = "mp.spawn"  # agent_failures.json's ``by`` when mp.spawn's parent wrote it
ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_NODE_RANK = "GPUDIAG_NODE_RANK"
ENV_NODE_RANK_FD = "GPUDIAG_NODE_RANK_FD"  # pipe to the launcher (see tell_launcher)
PR_SET_PDEATHSIG = 1
ENV_LAUNCHER_PID = "GPUDIAG_LAUNCHER_PID"
LIVENESS_POLL_S = 1.0  # a fallback: the parent-death signal comes first


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies. True when set
    (False elsewhere than Linux, or when prctl is unavailable)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_launcher(
    on_lost: object, pid: int | None = None, poll_s: float = LIVENESS_POLL_S
) -> bool:
    """Fallback for the parent-death signal (lost when the parent died before it was
    set, or the process was reparented): a task of gpudiag's service thread
    (:class:`gpudiag.capture.threads.Service`, every ``poll_s``) that calls ``on_lost()``
    once the launcher's pid (``GPUDIAG_LAUNCHER_PID``) is gone. ``on_lost`` must return
    at once (the service runs the rank's other watches too). False when there is no
    launcher pid to watch."""
    if pid is None:
        try:
            pid = int(os.environ.get(ENV_LAUNCHER_PID, ""))
        except ValueError:
            return False
    if pid <= 0:
        return False
    watched = pid

    def check() -> object:
        if pid_alive(watched):
            return None
        on_lost()  # type: ignore[operator]
        return threads.STOP

    threads.service().add(f"gpudiag-lwatch {watched}", check, poll_s)
    return True


def failure_rows(failures: dict) -> dict[str, dict]:
    """ChildFailedError.failures -> JSON rows keyed by global rank."""
    rows: dict[str, dict] = {}
    for rank, f in failures.items():
        code = int(getattr(f, "exitcode", 0) or 0)
        try:
            name = signal.Signals(-code).name if code < 0 else None
        except ValueError:
            name = f"signal {-code}"
        rows[str(rank)] = {
            "rank": int(rank),
            "local_rank": getattr(f, "local_rank", None),
            "pid": getattr(f, "pid", None),
            "exitcode": code,
            "signal": name,
            "observed_s": getattr(f, "timestamp", None),
        }
    return rows


def _write_agent_file(document: dict) -> None:
    """node<N>/agent_failures.json of this node, when the launcher named a run directory."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    from gpudiag import rundir

    node = int(os.environ.get(ENV_NODE_RANK, "0") or 0)
    path = rundir.node_dir(run_dir, node) / AGENT_FAILURES
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json_atomic(path, {"t_ns": time.time_ns(), **document})
    except (OSError, TypeError, ValueError):
        pass


def write_failures(failures: dict) -> None:
    _write_agent_file({"failures": failure_rows(failures)})


def note_spawn_parent() -> None:
    """The process gpudiag started handed its rank over to mp.spawn's workers: its exit
    code is no rank's (a forwarded SIGTERM ended it while its workers were starting, and
    its 143 read as rank 0's death: probe 28i, F5)."""
    _write_agent_file({"by": SPAWN_PARENT, "failures": {}})


def write_spawned_failure(process: Any) -> None:
    """The mp.spawn worker torch named as the first to fail without an error of its own
    (``spawn.watch_exits``), as the agent's failure of its rank: the rank whose
    rank_info.json has its pid."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    from gpudiag import rundir

    for rank in rundir.list_ranks(run_dir):
        info = rundir.read_json(rundir.rank_dir(run_dir, rank) / rundir.RANK_INFO)
        if isinstance(info, dict) and info.get("pid") == process.pid:
            _write_agent_file({"failures": failure_rows({rank: process}), "by": SPAWN_PARENT})
            return


def rendezvous_failure(exc: BaseException, argv: list[str]) -> str:
    """One line: the rendezvous did not complete, and why (torch's first line)."""
    flags = {a: b for a, b in zip(argv, [*argv[1:], ""], strict=True) if a.startswith("--")}
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    nnodes = flags.get("--nnodes", "?")
    where = flags.get("--rdzv-endpoint") or (
        f"{flags.get('--master-addr', '127.0.0.1')}:{flags.get('--master-port', '29500')}"
    )
    return (
        f"rendezvous failed: not all {nnodes} node(s) joined at {where} "
        f"({type(exc).__name__}: {first}); start gpudiag trace on every node with the "
        "same --nnodes and rendezvous flags, or raise the timeout with --rdzv-conf "
        "timeout=S (static) / join_timeout=S (c10d)"
    )


def write_rendezvous_error(text: str) -> None:
    _write_agent_file({"failures": {}, "rendezvous_error": text})


def _hang_reported() -> bool:
    """Whether the hang watchdog ended this job: torchrun's table would then name a
    rank the watchdog ended as the root cause."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return False
    from gpudiag import rundir

    return bool(rundir.hang_report_paths(run_dir))


def hook_rendezvous() -> bool:
    """Once torchrun's rendezvous is complete, measure this node's clock offset to node
    0 through the rendezvous store (:mod:`gpudiag.capture.clock`, in a background
    thread) and write it to ``node<K>/clock.json``, K being the node rank the rendezvous
    gave (``--node-rank``, or the c10d rendezvous's own order). Only multi-node jobs;
    the first rendezvous only (a restart keeps the first measurement)."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return False
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except ImportError:
        return False
    original = SimpleElasticAgent._rendezvous
    done: list[bool] = []

    def _rendezvous(self: object, worker_group: object) -> None:
        original(self, worker_group)
        if done:
            return
        done.append(True)
        try:
            node = int(getattr(worker_group, "group_rank", 0))
            nnodes = int(getattr(worker_group, "group_world_size", 1))
            os.environ[ENV_NODE_RANK] = str(node)  # the agent's own records
            tell_launcher(node)
            if nnodes > 1:
                from gpudiag.capture import clock

                clock.start(
                    getattr(worker_group, "store", None),
                    node,
                    nnodes,
                    lambda record: _write_clock(run_dir, node, record),
                )
        except Exception:  # noqa: BLE001 - never the job's problem
            pass

    SimpleElasticAgent._rendezvous = _rendezvous  # type: ignore[method-assign]
    return True


def tell_launcher(node: int) -> None:
    """Hand the node rank the rendezvous gave to the launcher (c10d rendezvous without
    --node-rank: it learns its node rank only now), through the pipe it passed."""
    try:
        fd = int(os.environ.pop(ENV_NODE_RANK_FD, ""))
    except ValueError:
        return
    try:
        os.write(fd, f"{node}\n".encode())
        os.close(fd)
    except OSError:
        pass


def _write_clock(run_dir: str, node: int, record: dict) -> None:
    from gpudiag import rundir

    path = rundir.node_dir(run_dir, node) / rundir.CLOCK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json_atomic(path, record)
    except (OSError, TypeError, ValueError):
        pass


def _on_launcher_lost() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _deliver_held_signals() -> None:
    """Before torchrun starts: a Ctrl-C or SIGTERM that came while held ends this agent
    as it would have ended plain torchrun then (before any rank: no status to write)."""
    try:
        deferred_signals.release_all()
    except KeyboardInterrupt:
        os._exit(128 + signal.SIGINT)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # a Ctrl-C or SIGTERM while gpudiag imports torch's elastic stack waits for torchrun,
    # which handles both: raised inside torch's import it could abort this process
    # (capture/deferred_signals.py)
    deferred_signals.hold()
    die_with_parent(signal.SIGTERM)
    watch_launcher(_on_launcher_lost)
    from gpudiag.capture.clock import install_test_shift

    install_test_shift()
    hook_rendezvous()
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    _deliver_held_signals()
    code = 0
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        write_failures(exc.failures)
        if _hang_reported():
            print("gpudiag: the hang watchdog ended the ranks (report follows)", file=sys.stderr)
        else:
            print(exc, file=sys.stderr)  # torchrun's failure table, without its traceback
        code = 1
    except SignalException as exc:
        signum = int(getattr(exc, "sigval", signal.SIGTERM))
        _write_agent_file({"signal": signal.Signals(signum).name})  # see _agent_signal
        code = 128 + signum
    except (RendezvousError, DistError, TimeoutError) as exc:
        # a node that never joined (or a rendezvous endpoint nobody serves): one line
        text = rendezvous_failure(exc, argv)
        write_rendezvous_error(text)
        print(f"gpudiag: {text}", file=sys.stderr)
        code = 1
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
