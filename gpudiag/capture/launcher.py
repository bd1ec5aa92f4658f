"""``gpudiag trace [options] script.py [args...]`` / ``gpudiag trace [options] -m mod [args...]``.

One launcher per node. It writes the manifest, starts the job (one worker process, or
torch.distributed.run with gpudiag's worker as the training module: gpudiag never does
rendezvous itself), runs the sampler and the hang watchdog, forwards Ctrl-C/SIGTERM,
decides how the run ended from the ranks' status.json files, and exits with the job's
exit code. Everything after the script or module name belongs to the script.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture import leftovers, proctree, threads
from gpudiag.capture import manifest as manifest_mod
from gpudiag.capture import worker as worker_mod
from gpudiag.capture.agent import ENV_LAUNCHER_PID, ENV_NODE_RANK_FD
from gpudiag.capture.ddp import ENV_DDP_HOOK
from gpudiag.capture.forwarding import Forwarder
from gpudiag.capture.launch_outcome import (
    _incomplete_reasons,
    _rendezvous_error,
    decide_outcome,
    ended_by_passed,
)
from gpudiag.capture.profiling import DEFAULT_WINDOW, parse_window
from gpudiag.capture.run_claim import (
    RESERVE_BYTES,
    _deleted,
    _no_room,
    _open_dir,
    _write_manifest,
    claim_run_dir,
    inodes_short,
    low_space_warning,
    outside_working_folder,
)

KILL_GRACE_S = 30.0
# The same signal again within this long is the first one delivered twice, not a second
# request: GNU `timeout` (without --foreground) sends its signal to its child and then to
# its whole process group, so the launcher got every SIGTERM / Ctrl-C twice within
# microseconds and killed the job at once: every rank's status lost in 21 of 61 stops
# (issue 28 probe). A person's second Ctrl-C comes later than this.
REPEAT_SIGNAL_S = 1.0
# How often the launcher touches its manifest while the job runs: readers on other hosts
# see a run whose manifest is older than rundir.LAUNCHER_STALE_S as launcher_lost.
HEARTBEAT_S = rundir.LAUNCHER_HEARTBEAT_S
TICK_S = 0.2  # the launcher's own loop: heartbeat, rank exits, joins, kill deadline
PIDS_RESCAN_S = 5.0  # the sampler's view of the job's processes (Job.known_pids)
# On a hang the watchdog asks every rank to flush and exit (their poller threads do it
# while the main threads sit in C++ collectives). Ranks that have not ended after
# HANG_FLUSH_WAIT_S (a GIL never released) get SIGTERM, then SIGKILL HANG_KILL_GRACE_S
# later.
HANG_FLUSH_WAIT_S = 25.0
HANG_KILL_GRACE_S = 5.0
# Ranks the job's process did not outlive (a rank re-executed by a traced rank that
# failed: it notices at that process's exit) get this long to write their status.
ORPHAN_WAIT_S = 30.0


@dataclass
class TraceArgs:
    """What `gpudiag trace` asks of the launcher (parsed by gpudiag/cli/trace.py)."""

    options: argparse.Namespace
    target: dict[str, str]  # {"script": path} or {"module": name}
    script_args: list[str]
    torchrun_argv: list[str] = field(default_factory=list)


def uses_torchrun(args: TraceArgs) -> bool:
    ns = args.options
    single = (ns.nproc_per_node in (None, "1")) and (ns.nnodes in (None, "1"))
    return not single or bool(args.torchrun_argv)


def job_command(args: TraceArgs) -> list[str]:
    target = ["-m", args.target["module"]] if "module" in args.target else [args.target["script"]]
    worker = ["-m", "gpudiag.capture.rank", *target, *args.script_args]
    if uses_torchrun(args):
        return [sys.executable, "-m", "gpudiag.capture.agent", *args.torchrun_argv, *worker]
    # -P: the launch folder is not put first on sys.path. `python sub/train.py` does not
    # put it there, and a numpy.py or a torch/ checkout in it shadowed gpudiag's own
    # imports before the script's path was set (eleventh probe, B); the worker puts the
    # script's folder (or, for -m, the working folder) first, as python would.
    return [sys.executable, "-P", *worker]


def profile_config(ns: argparse.Namespace) -> dict[str, Any]:
    if ns.no_profile:
        return {"enabled": False, "steps": None, "default": False}
    if ns.profile_steps:
        return {"enabled": True, "steps": list(parse_window(ns.profile_steps)), "default": False}
    return {"enabled": True, "steps": list(DEFAULT_WINDOW), "default": True}


def _expected_world_size(ns: argparse.Namespace) -> int | None:
    try:
        nproc = int(ns.nproc_per_node or 1)
        nnodes = int(ns.nnodes or 1)
    except ValueError:  # "auto", "gpu", "1:4" ...
        return None
    return nproc * nnodes


KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
KINETO_QUIET = "6"


def worker_env(
    run_dir: Path, node_rank: int | None, profile: dict[str, Any], time_buckets: bool = False
) -> dict[str, str]:
    """The job's environment. ``node_rank`` None: the c10d rendezvous assigns it (the
    ranks read torchrun's GROUP_RANK)."""
    env = dict(os.environ)
    try:
        from gpudiag.capture.collectives import worker_env as collectives_env

        env.update(collectives_env())
    except ImportError:
        pass
    env[worker_mod.ENV_RUN_DIR] = str(run_dir)
    env[ENV_LAUNCHER_PID] = str(os.getpid())
    if node_rank is not None:
        env[worker_mod.ENV_NODE_RANK] = str(node_rank)
    else:
        env.pop(worker_mod.ENV_NODE_RANK, None)
    if time_buckets:
        env[ENV_DDP_HOOK] = "1"
    if profile["enabled"]:
        a, b = profile["steps"]
        env[worker_mod.ENV_PROFILE_STEPS] = f"{a}-{b}"
        env[worker_mod.ENV_PROFILE_DEFAULT] = "1" if profile["default"] else "0"
        # torch 2.13's Kineto prints "USDT: ... profiler_start/stop" on stderr at each
        # window, lines the job never printed under torchrun; level 6 is above all of
        # Kineto's levels (USDT is 5). A level the user set is theirs.
        env.setdefault(KINETO_LOG_LEVEL, KINETO_QUIET)
    else:
        env[worker_mod.ENV_PROFILE_STEPS] = "off"
    return env


# --------------------------------------------------------------------------- the job


class Job:
    """The running job: signal forwarding, grace period, kill."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        heartbeat: Path | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        # Own session: a terminal Ctrl-C reaches only the launcher, which forwards it once.
        # The job process (torchrun's agent, or the single worker) dies with the launcher:
        # it sets its own parent-death signal at start (agent.die_with_parent).
        self.proc = subprocess.Popen(command, env=env, start_new_session=True, pass_fds=pass_fds)
        # A job gpudiag started as one process (no torchrun): a forwarded signal goes to
        # its whole process group, as a terminal's Ctrl-C does, so the ranks the script
        # starts itself (mp.spawn, Lightning's launcher) and its helpers get it too; only
        # the top process got it, and they were SIGKILLed 30 s later with no status
        # (probe 28g, N1). torchrun's agent forwards to its workers itself.
        self.signal_group = False
        self.signal_received: int | None = None
        # signals passed on to the processes that handle them (capture/user_signals)
        self.passed_signals: list[int] = []
        # called with the first signal received, before it is forwarded to the job
        self.on_signal: Callable[[int], None] | None = None
        self.kill_deadline: float | None = None
        self._last_stop: tuple[int, float] | None = None  # (signal, monotonic time)
        self._lock = threading.Lock()
        self._heartbeat = heartbeat
        self._next_beat = time.monotonic() + HEARTBEAT_S
        self._pids: list[int] = []
        self._pids_due = 0.0
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: Popen.wait's polling
            pass

    def _wait_tick(self) -> int:
        """The job's exit code, or TimeoutExpired after TICK_S. Blocks on a pidfd (one
        wakeup per tick): ``Popen.wait(timeout)`` polls waitpid with sleeps of 0.5-50 ms,
        ~50 wakeups a second that took 0.5 % of a core from the ranks."""
        if self._pidfd is None:
            return self.proc.wait(timeout=TICK_S)
        if self.proc.returncode is None:
            ready, _, _ = select.select([self._pidfd], [], [], TICK_S)
            if not ready:
                raise subprocess.TimeoutExpired(self.proc.args, TICK_S)
        code = self.proc.wait()
        os.close(self._pidfd)
        self._pidfd = None
        return code

    def pids(self) -> list[int]:
        """The job's processes: the started one and all its descendants."""
        pids = [self.proc.pid]
        try:
            pids += proctree.descendants(self.proc.pid)
        except OSError:
            try:
                import psutil

                pids += [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
            except Exception:
                pass
        return pids

    def known_pids(self) -> list[int]:
        """The job's processes for the sampler, rescanned every PIDS_RESCAN_S: psutil
        finds children by reading every process's /proc/<pid>/stat (4-5 ms of CPU with
        ~160 processes), which at 10 Hz took ~5 % of a core from the training."""
        now = time.monotonic()
        if now >= self._pids_due:
            self._pids = self.pids()
            # often at first (torchrun starts its workers after a second or more)
            self._pids_due = now + (PIDS_RESCAN_S if len(self._pids) > 1 else 0.5)
        return self._pids

    def stop(self, signum: int = signal.SIGTERM, grace_s: float = KILL_GRACE_S) -> None:
        """Forward a signal; a second request, or the grace period running out, kills.
        The same signal again within REPEAT_SIGNAL_S is the first one delivered twice."""
        now = time.monotonic()
        with self._lock:
            last, self._last_stop = self._last_stop, (signum, now)
            if last is not None and last[0] == signum and now - last[1] < REPEAT_SIGNAL_S:
                return
            if self.kill_deadline is not None and signum != signal.SIGKILL:
                self.kill()
                return
            self.kill_deadline = now + grace_s
        if self.signal_group:
            self._send_group(self.proc.pid, signum)
        else:
            self._send(self.proc.pid, signum)

    def kill(self) -> None:
        for pid in reversed(self.pids()):
            self._send(pid, signal.SIGKILL)

    @staticmethod
    def _send_group(pid: int, signum: int) -> None:
        """To the process group the job leads (its own session, start_new_session)."""
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            Job._send(pid, signum)

    @staticmethod
    def _send(pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def beat(self) -> None:
        """Touch the manifest (no data written: works on a full disk too)."""
        if self._heartbeat is None or time.monotonic() < self._next_beat:
            return
        self._next_beat = time.monotonic() + HEARTBEAT_S
        try:
            os.utime(self._heartbeat)
        except OSError:
            pass

    def wait(self, on_tick: Any = None) -> int:
        """Until the job exits, with ``on_tick`` and the heartbeat every TICK_S."""
        while True:
            try:
                return self._wait_tick()
            except subprocess.TimeoutExpired:
                self.beat()
                if on_tick is not None:
                    on_tick()
                if self.kill_deadline is not None and time.monotonic() > self.kill_deadline:
                    self.kill()
                    self.kill_deadline = time.monotonic() + KILL_GRACE_S


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (one small read; psutil built a Process,
    read its status, CPU times and I/O counters for this, five times a second)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        from gpudiag.capture.watchdog import sample_usage

        return sample_usage(pid).alive


class RankExits:
    """When each local rank's process was first seen gone (the order of deaths)."""

    def __init__(self, run_dir: Path, node: int | None = None) -> None:
        self.run_dir = run_dir
        self.node = node
        self.pids: dict[int, int] = {}
        self.gone_ns: dict[int, int] = {}
        self._ranks_due = 0.0

    def poll(self) -> None:
        try:
            from gpudiag.capture.watchdog import _local_ranks

            now = time.monotonic()
            if now >= self._ranks_due:  # new ranks appear rarely: look once a second
                self._ranks_due = now + 1.0
                if len(self.pids) < len(rundir.list_ranks(self.run_dir)):
                    self.pids.update(_local_ranks(self.run_dir, self.node))
            for rank, pid in self.pids.items():
                if rank not in self.gone_ns and not _alive(pid):
                    self.gone_ns[rank] = time.time_ns()
        except Exception:  # noqa: BLE001 - bookkeeping only
            pass


# --------------------------------------------------------------------------- outcome


# --------------------------------------------------------------------------- helpers


def _start_sampler(run_dir: Path, node_rank: int, hz: float, job: Job) -> Any:
    try:
        from gpudiag.capture.sampler import Sampler
    except ImportError:
        return None
    try:
        sampler = Sampler(
            run_dir, node=node_rank, interval_s=1.0 / hz, pids_provider=job.known_pids
        )
        sampler.start()
    except Exception as exc:
        _say(f"sampler not started ({type(exc).__name__}: {exc})")
        return None
    notice = getattr(sampler, "notice", None)
    if notice:
        _say(str(notice))
    return sampler


def _start_job(
    command: list[str],
    env: dict[str, str],
    manifest_path: Path,
    join: NodeJoin | None,
    forwarder: Forwarder,
) -> Job:
    try:
        return Job(
            command,
            env,
            heartbeat=manifest_path if join is None else None,
            pass_fds=join.pass_fds if join is not None else (),
        )
    except BaseException:
        forwarder.restore()
        raise


def _signal_recorder(
    run_dir: Path, join: NodeJoin | None, node_rank: int, ns: argparse.Namespace
) -> Callable[[int], None] | None:
    """Job.on_signal of a multi-node launcher (this node's number, once known); None on
    one node, where no other launcher reads it."""
    if not _multi_node(ns):
        return None
    return lambda signum: _record_signal(
        run_dir, join.node if join is not None else node_rank, signum
    )


def _record_signal(run_dir: Path, node: int | None, signum: int) -> None:
    """node<N>/launcher_signal.json: this node's launcher received ``signum`` and ends its
    ranks with it, so another node's launcher does not call their end a signal from
    outside the job. Never fails the launcher (a full disk: not recorded)."""
    if node is None:
        return
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    try:
        rundir.write_json_atomic(
            rundir.node_dir(run_dir, node) / rundir.LAUNCHER_SIGNAL,
            {"signal": name, "time_ns": time.time_ns()},
        )
    except OSError:
        pass


def _multi_node(ns: argparse.Namespace) -> bool:
    return ns.nnodes not in (None, "1", "1:1")


def _local_rank_count(nproc_per_node: str | None) -> int | None:
    try:
        return int(nproc_per_node or 1)
    except ValueError:  # "auto", "gpu" ...
        return None


def _wait_for_ranks_to_finish(
    run_dir: Path, job: Job, limit_s: float, node: int | None = None
) -> None:
    """Until every local rank wrote status.json and exited, the job ended, or limit_s.
    A rank stopped by SIGSTOP, Ctrl-Z or a debugger flushes nothing until continued, and
    gpudiag does not continue it (its code would run on): it is not waited for (before,
    the flush wait ran out first, then the grace period)."""
    from gpudiag.capture.watchdog import _local_ranks, sample_usage

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and job.proc.poll() is None:
        ranks = _local_ranks(run_dir, node)
        usages = [sample_usage(pid) for pid in ranks.values()]
        if all(not u.alive or u.stopped for u in usages) and any(u.stopped for u in usages):
            return  # torchrun waits for the stopped rank forever: nothing to give it time for
        if all(not u.alive for u in usages):
            # torchrun notices its workers' exit and ends on its own: give it the time
            deadline = min(deadline, time.monotonic() + HANG_KILL_GRACE_S)
        time.sleep(0.2)


def _wait_for_orphan_ranks(run_dir: Path, exits: RankExits, limit_s: float) -> None:
    """After the job's process ended: until every local rank that is still running has
    written status.json and exited, or ``limit_s``. Those are ranks it did not start
    through torchrun's agent, which waits for its own (a rank Lightning re-executed, its
    parent gone); they end on their parent-death signal or their peer's closed socket."""
    exits._ranks_due = 0.0
    exits.poll()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        exits.poll()
        running = [
            r
            for r, pid in exits.pids.items()
            if r not in exits.gone_ns and not rundir.final_status_written(run_dir, r)
        ]
        if not running:
            return
        time.sleep(TICK_S)


def _start_watchdog(
    run_dir: Path,
    timeout_s: float,
    job: Job,
    hang: threading.Event,
    local_ranks: int | None = None,
    node: int | None = None,
    on_hang_mode: str = "auto",
) -> Any:
    if timeout_s <= 0:
        return None
    try:
        from gpudiag.capture.watchdog import HangWatchdog
    except ImportError:
        return None

    def on_hang(report: dict[str, Any]) -> None:
        hang.set()
        _say(
            f"hang: no progress for {report.get('detected_after_s', timeout_s)} s: "
            f"{report.get('verdict')}; ranks flush their data and exit"
        )
        _wait_for_ranks_to_finish(run_dir, job, HANG_FLUSH_WAIT_S, node)
        if job.proc.poll() is None:
            job.stop(signal.SIGTERM, grace_s=HANG_KILL_GRACE_S)

    def on_notice(text: str) -> None:
        if text.startswith("progress resumed"):
            _say(f"{text}")
        else:
            _say(f"no progress for {timeout_s:g} s, {text} (stacks in rank*/stacks.txt)")

    try:
        watchdog = HangWatchdog(
            run_dir,
            timeout_s,
            on_hang=on_hang,
            on_notice=on_notice,
            expected_local_ranks=local_ranks,
            node=node,
            on_hang_mode=on_hang_mode,
            ending=lambda: job.signal_received is not None,
        )
        watchdog.start()
        return watchdog
    except Exception as exc:
        _say(f"hang watchdog not started ({type(exc).__name__}: {exc})")
        return None


# (run directory, target) -> one-line reason it was skipped, or None
PreRun = Callable[[Path, dict[str, str]], "str | None"]


def _pre_run(fn: PreRun, run_dir: Path, target: dict[str, str]) -> None:
    try:
        problem = fn(run_dir, target)
    except Exception as exc:  # noqa: BLE001 - the job must not depend on it
        problem = f"lint skipped ({type(exc).__name__}: {exc})"
    if problem:
        _say(problem)


def _stop_quietly(thing: Any, what: str) -> None:
    if thing is None:
        return
    try:
        thing.stop()
    except Exception as exc:
        _say(f"{what} did not stop cleanly ({type(exc).__name__}: {exc})")


def _settle_quietly(watchdog: Any) -> None:
    """A hang the watchdog suspected but left running, settled at the job's end."""
    if watchdog is None:
        return
    try:
        watchdog.settle()
    except Exception as exc:  # noqa: BLE001 - bookkeeping only
        _say(f"hang report not settled ({type(exc).__name__}: {exc})")


def _say(text: str) -> None:
    print(f"gpudiag: {rundir.one_line(text)}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- main


def _refused(forwarder: Forwarder) -> int:
    """No job is started (the run directory refused): the launcher's signals as they were."""
    forwarder.restore()
    return 2


def run(args: TraceArgs, argv: list[str], pre_run: PreRun | None = None) -> int:
    """Run the job described by ``args`` (``argv``: the command line, for the manifest);
    ``pre_run(run_dir, target)`` runs in a thread while it starts (the command layer's lint
    of the script: capture does not import the linter). Returns the exit code."""
    ns = args.options
    node_rank = ns.node_rank or 0
    # c10d rendezvous without --node-rank: the rendezvous numbers the nodes; the agent
    # tells this launcher its number once it is known (NodeJoin)
    dynamic = assigned_node_rank(ns)
    from gpudiag.capture.clock import install_test_shift

    install_test_shift()  # tests only: a skewed host (GPUDIAG_TEST_CLOCK_SHIFT_NS)
    # from before the claim: a Ctrl-C then is forwarded once the job has started (it was
    # a traceback and a manifest left `running`); the job's processes get the defaults
    forwarder = Forwarder()
    run_dir = _claim_out(args, None if dynamic else node_rank)
    if run_dir is None:
        return _refused(forwarder)
    profile = profile_config(ns)
    launch = _launch_info(args)
    env = worker_env(run_dir, None if dynamic else node_rank, profile, ns.time_buckets)
    join = NodeJoin(env) if dynamic else None
    manifest = manifest_mod.initial_manifest(
        env=env, argv=argv, target=args.target, script_args=args.script_args,
        launch=launch, node_rank=node_rank, profile=profile,
    )  # fmt: skip
    manifest_path = rundir.manifest_path(run_dir, node_rank)
    claimed = (
        _first_manifest(run_dir, manifest_path, manifest, node_rank, ns) if join is None else None
    )
    if claimed is not None and claimed.refused:
        return _refused(forwarder)
    reserve = claimed.reserve if claimed is not None else None
    rank_reserves = claimed.rank_reserves if claimed is not None else []
    _say(f"tracing into {run_dir}")
    run_dir_fd = _open_dir(run_dir)  # to tell at the end whether it was deleted meanwhile

    job = _start_job(launch["command"], env, manifest_path, join, forwarder)
    job.signal_group = not launch["torchrun"]
    job.on_signal = _signal_recorder(run_dir, join, node_rank, ns)
    forwarder.started(job)
    if join is not None:
        join.started()
    hang = threading.Event()
    sampler = _start_sampler(run_dir, node_rank, ns.sample_hz, job) if join is None else None
    watchdog = _start_watchdog(
        run_dir,
        ns.hang_timeout,
        job,
        hang,
        _local_rank_count(ns.nproc_per_node),
        node_rank if join is None else None,
        getattr(ns, "on_hang", "auto"),
    )
    lint_thread = _start_lint(pre_run, run_dir, args)
    exits = RankExits(run_dir, node_rank if join is None else None)

    node = _Node(run_dir, manifest, ns, node_rank, manifest_path, reserve, sampler, job, exits)
    node.watchdog = watchdog

    def on_tick() -> None:
        exits.poll()
        if join is not None:
            join.poll(node.joined)

    try:
        returncode = job.wait(on_tick=on_tick)
    finally:
        forwarder.restore()
        _stop_quietly(watchdog, "hang watchdog")
        _stop_quietly(node.sampler, "sampler")
    if lint_thread is not None:
        lint_thread.join(timeout=30)
    if not (hang.is_set() or getattr(watchdog, "fired", False)):
        _wait_for_orphan_ranks(run_dir, exits, ORPHAN_WAIT_S)
        _settle_quietly(watchdog)
    if join is not None:
        join.poll(node.joined)  # the job may have ended right after its rendezvous
        if join.node is None:  # the rendezvous never numbered this node
            return _unjoined(run_dir, returncode, job.signal_received)

    rundir.release_space(node.reserve)
    for left in rank_reserves or ():  # a rank that never started leaves its reserve
        rundir.release_space(left)
    received = job.signal_received or ended_by_passed(run_dir, returncode, job.passed_signals)
    outcome = decide_outcome(
        run_dir,
        returncode,
        received,
        hang.is_set() or bool(getattr(watchdog, "fired", False)),
        launch["expected_world_size"],
        gone_ns=exits.gone_ns,
        single_process=not launch["torchrun"],
        node=node.node_rank if _multi_node(ns) else None,
        nproc_per_node=_local_rank_count(ns.nproc_per_node),
    )
    _record_outcome(run_dir, manifest, outcome, returncode, node.sampler, node.node_rank)
    code = _write_final_manifest(run_dir, node.manifest_path, manifest, outcome, run_dir_fd)
    leftovers.sweep({job.proc.pid, *exits.pids.values()}, _say)
    return code


@dataclass
class _Node:
    """This launcher's node: what changes when the c10d rendezvous numbers it."""

    run_dir: Path
    manifest: dict[str, Any]
    ns: argparse.Namespace
    node_rank: int
    manifest_path: Path
    reserve: Path | None
    sampler: Any
    job: Job
    exits: RankExits
    watchdog: Any = None

    def joined(self, node: int) -> None:
        """The rendezvous numbered this node: claim its manifest, start its sampler."""
        self.node_rank = node
        self.manifest["node_rank"] = node
        for host in self.manifest.get("hosts") or []:
            host["node_rank"] = node
        self.manifest_path = rundir.manifest_path(self.run_dir, node)
        try:
            _write_manifest(self.manifest_path, self.manifest, first=True)
        except FileExistsError:
            _say(
                f"trace: {self.manifest_path} exists: another run wrote into {self.run_dir}; "
                "stopping"
            )
            self.job.stop(signal.SIGTERM)
            return
        _say(f"the rendezvous made this node {node}")
        self.job._heartbeat = self.manifest_path
        self.reserve = rundir.reserve_space(rundir.reserve_path(self.run_dir, node), RESERVE_BYTES)
        self.sampler = _start_sampler(self.run_dir, node, self.ns.sample_hz, self.job)
        self.exits.node = node
        if self.watchdog is not None:
            self.watchdog.node = node


@dataclass
class _Claimed:
    """The run's first manifest and the room kept for its end (:func:`_first_manifest`)."""

    refused: bool
    reserve: Path | None = None
    rank_reserves: list[Path] | None = None


def _first_manifest(
    run_dir: Path,
    manifest_path: Path,
    manifest: dict[str, Any],
    node_rank: int,
    ns: argparse.Namespace,
) -> _Claimed:
    """Write the first manifest, after reserving the room for the run's end: a run that
    cannot record how it ended is refused now, before the job starts, not reported as
    "running" forever; so is one that cannot keep each local rank's room for its status
    (the ranks take theirs by name: rundir.handed_reserve_path). A file size limit
    (ulimit -f) below the reserves is no reason to refuse the job: it runs as it would
    without gpudiag, and what does not fit is marked incomplete."""
    local = _local_rank_count(ns.nproc_per_node) or 1
    short = inodes_short(run_dir, local)
    if short is not None:
        return _refuse(run_dir, short)
    fsize = rundir.file_size_limit()
    if fsize is not None and fsize < RESERVE_BYTES:
        try:
            rundir.write_json_exclusive(manifest_path, manifest)
        except FileExistsError:
            _say(f"trace: {run_dir}: another gpudiag run took this directory; choose another --out")
            return _Claimed(refused=True)
        except OSError as exc:
            rundir.note_write_problem(manifest_path, exc, "manifest")
        return _Claimed(refused=False, rank_reserves=[])
    reserve = rundir.reserve_space(rundir.reserve_path(run_dir, node_rank), RESERVE_BYTES)
    rank_reserves: list[Path] | None = []
    if reserve is not None:
        rank_reserves = rundir.reserve_for_ranks(run_dir, node_rank, local)
    no_room = reserve is None or rank_reserves is None
    if not no_room:
        try:
            rundir.write_json_exclusive(manifest_path, manifest)
        except FileExistsError:
            _say(f"trace: {run_dir}: another gpudiag run took this directory; choose another --out")
            return _Claimed(refused=True)
        except OSError:  # no room left for the manifest itself (384 KiB for 2 ranks)
            no_room = True
    if no_room:
        for made in (reserve, *(rank_reserves or ())):
            rundir.release_space(made)
        return _refuse(run_dir, _no_room(run_dir))
    low = low_space_warning(run_dir)
    if low is not None:
        _say(f"trace: {low}")
    return _Claimed(refused=False, reserve=reserve, rank_reserves=rank_reserves)


def _refuse(run_dir: Path, why: str) -> _Claimed:
    """One line saying why the run is refused at start; its directory goes if empty."""
    _say(f"trace: {run_dir}: {why}")
    try:
        run_dir.rmdir()  # only when empty: created for this run
    except OSError:
        pass
    return _Claimed(refused=True)


def _claim_out(args: TraceArgs, node_rank: int | None) -> Path | None:
    """The run directory, claimed for this run; None (said why) when it cannot be."""
    ns = args.options
    if ns.out is not None and rundir.has_control_chars(ns.out):
        # torch's exporter cannot write such a path, and every line naming it would split
        _say("trace: --out must not contain a newline or other control characters")
        return None
    run_dir, problem = claim_run_dir(ns.out, args.target, node_rank)
    if problem:
        _say(f"trace: {run_dir}: {problem}")
        return None
    if ns.out is None and outside_working_folder(run_dir):
        _say(
            "trace: the working folder takes no new directory; the run goes to the temporary "
            "folder (--out chooses where)"
        )
    return run_dir


def _start_lint(pre_run: PreRun | None, run_dir: Path, args: TraceArgs) -> Any:
    """The command layer's lint of the script, in a thread while the job starts."""
    if pre_run is None or args.options.no_lint:
        return None
    return threads.start(_pre_run, "gpudiag-lint", args=(pre_run, run_dir, args.target))


def _launch_info(args: TraceArgs) -> dict[str, Any]:
    """How the job is started (the manifest's ``launch``)."""
    ns = args.options
    return {
        "torchrun": uses_torchrun(args),
        "torchrun_argv": args.torchrun_argv,
        "command": job_command(args),
        "nproc_per_node": ns.nproc_per_node or "1",
        "nnodes": ns.nnodes or "1",
        "expected_world_size": _expected_world_size(ns),
    }


def _write_final_manifest(
    run_dir: Path,
    manifest_path: Path,
    manifest: dict[str, Any],
    outcome: dict[str, Any],
    run_dir_fd: int | None,
) -> int:
    """The manifest with what made the record incomplete, written; the final line; the
    exit code."""
    if _deleted(run_dir_fd):
        rundir.note_problem(rundir.deleted_while_written(run_dir))
    incomplete = _incomplete_reasons(run_dir, outcome, rundir.write_problems())
    manifest["incomplete"] = incomplete or None
    if not _write_manifest(manifest_path, manifest, first=False):
        _say(f"the manifest could not be updated: {manifest_path} still says running")
    if incomplete:
        _say(f"run incomplete: {'; '.join(incomplete)}")
    _report(run_dir, manifest)
    return int(manifest["exit_code"])


def _record_outcome(
    run_dir: Path,
    manifest: dict[str, Any],
    outcome: dict[str, Any],
    returncode: int,
    sampler: Any,
    node_rank: int,
) -> None:
    """The job's end in the manifest: the outcome, the sampler, the clock, the versions."""
    manifest.update(
        end_ns=time.time_ns(),
        job_returncode=returncode,
        sampler=getattr(sampler, "kind", None),
        sampler_notice=getattr(sampler, "notice", None),
        **{k: outcome[k] for k in _OUTCOME_KEYS},
    )
    clock = rundir.read_json(rundir.node_dir(run_dir, node_rank) / rundir.CLOCK)
    if isinstance(clock, dict):
        manifest["clock"] = clock
    manifest["world_size"] = outcome["world_size"] or manifest["world_size"]
    manifest["backend"] = outcome["backend"]
    if outcome["rank_versions"]:
        manifest["versions"].update(outcome["rank_versions"])


# what decide_outcome says that the manifest keeps as it is
_OUTCOME_KEYS = (
    "status",
    "exit_code",
    "failed_ranks",
    "failure",
    "missing_status_ranks",
    "ranks_elsewhere",
    "traced_ranks",
    "untraced_ranks",
    "init_method",
    "steps_completed",
    "launcher_signal",
)


def assigned_node_rank(ns: argparse.Namespace) -> bool:
    """A multi-node job whose node rank the c10d rendezvous assigns (no --node-rank)."""
    backend = ns.rdzv_backend
    return _multi_node(ns) and ns.node_rank is None and backend not in (None, "static")


class NodeJoin:
    """The node rank a c10d rendezvous gives this node, read from a pipe the agent
    writes once its rendezvous is complete (agent.tell_launcher)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        env[ENV_NODE_RANK_FD] = str(self._write)
        self.pass_fds = (self._write,)
        self.node: int | None = None
        self._buffer = b""
        self._closed = False

    def started(self) -> None:
        os.close(self._write)  # the agent holds the only write end now

    def poll(self, on_join: Callable[[int], None]) -> None:
        if self._closed or self.node is not None:
            return
        try:
            chunk = os.read(self._read, 64)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the agent ended (or closed it) without a node rank
            self._closed = True
            os.close(self._read)
            return
        self._buffer += chunk
        if b"\n" in self._buffer:
            try:
                self.node = int(self._buffer.split(b"\n", 1)[0])
            except ValueError:
                self._closed = True
                return
            on_join(self.node)


def ranks_line(manifest: dict[str, Any]) -> str:
    """The ranks of the run for the final line: how many of the world were traced,
    which left nothing, which wrote no status, and the steps per rank."""
    steps = manifest.get("steps_completed") or {}
    traced = manifest.get("traced_ranks")
    traced = list(traced) if isinstance(traced, list) else sorted(steps)
    world = manifest.get("world_size") if isinstance(manifest.get("world_size"), int) else None
    untraced = manifest.get("untraced_ranks") or []
    if world and world > 1 and untraced:
        text = f"{len(traced)} of {world} rank(s) traced; rank(s) {_ranks(untraced)} left nothing"
        launch = manifest.get("launch")
        if not (isinstance(launch, dict) and launch.get("torchrun")):  # torchrun's died
            text += " (untraced, or started by another launcher)"
    elif world and world > len(traced):
        text = f"{len(traced)} of {world} rank(s)"
    else:
        text = f"{len(traced)} rank(s)"
    missing = manifest.get("missing_status_ranks")
    no_status = (
        [r for r in traced if r in missing]
        if isinstance(missing, list)
        else [r for r in traced if r not in steps and str(r) not in steps]
    )
    if no_status:
        text += f"; rank(s) {_ranks(no_status)} wrote no status"
    values = sorted({v for v in steps.values() if isinstance(v, int)})
    if not values:  # no rank wrote a status: nothing to count the steps by
        return f"{text}, no steps recorded"
    return f"{text}, steps per rank {values}"


def _ranks(ranks: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts: list[str] = []
    for r in sorted(ranks):
        if parts and isinstance(parts[-1], str) and parts[-1].split("-")[-1] == str(r - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def _unjoined(run_dir: Path, returncode: int, signum: int | None) -> int:
    """The job ended before the rendezvous numbered this node: no manifest (its name
    needs the number); one line, and the job's exit code."""
    why = _rendezvous_error(run_dir) or "the rendezvous did not complete"
    code = 128 + signum if signum is not None else (returncode or 1)
    _say(f"run failed (exit code {code}) before this node joined: {why} -> {run_dir}")
    return code


def _report(run_dir: Path, manifest: dict[str, Any]) -> None:
    text = f"run {manifest['status']} (exit code {manifest['exit_code']}), {ranks_line(manifest)}"
    if manifest.get("launcher_signal"):
        text += f"; gpudiag trace received {manifest['launcher_signal']}"
    failure = manifest.get("failure")
    if failure and failure.get("rank") is None:
        text += f"; {failure.get('message')}"
    elif failure:
        text += f"; rank {failure.get('rank')} failed: {failure.get('exc_type')}: {failure.get('message')}"
    _say(f"{text} -> {run_dir}")
