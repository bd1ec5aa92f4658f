"""How a traced job ended, as the launcher records it: the outcome (ok, failed, hang,
interrupted, lost ranks and nodes), the exit code it returns, the signals it forwards to
the job, and why the run's record is incomplete.

Moved out of launcher.py (issue 33); the launcher's run loop calls it. Capture-side:
imports nothing of lint/analysis/report/cli.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture import blame


def decide_outcome(
    run_dir: Path,
    returncode: int,
    signal_received: int | None,
    hang: bool,
    expected_world_size: int | None,
    gone_ns: dict[int, int] | None = None,
    single_process: bool = False,
    node: int | None = None,
    nproc_per_node: int | None = None,
) -> dict[str, Any]:
    """Status, exit code, failed ranks and the first failure (the cause, see
    :mod:`gpudiag.capture.blame`), from the ranks' status.json and how they ended.
    ``node`` (multi-node jobs): the launcher answers for its own node's ranks; another node's
    rank without status.json is that node's business (it may still be writing it, or write
    it into another directory), but its failures still count as causes."""
    statuses, infos = _rank_documents(run_dir)
    world = max(
        [expected_world_size or 0, *(int(i.get("world_size") or 0) for i in infos.values())]
    )
    own = _node_ranks(infos, node, nproc_per_node, world) if node is not None else None
    missing = [r for r in range(world) if r not in statuses and (own is None or r in own)]
    # earliest failure first: the others usually failed because that rank went away
    failed = sorted(
        (r for r, s in statuses.items() if s.get("status") == "failed"),
        key=lambda r: (statuses[r].get("end_ns") or 0, r),
    )
    failure = None
    ends = blame.rank_ends(
        run_dir,
        sorted(set(range(world)) | set(statuses) | set(infos)),
        statuses,
        gone_ns,
        returncode if single_process else None,
    )
    if own is not None and not hang:
        _mark_other_nodes_lost(run_dir, ends, own, infos)
    if hang or signal_received is not None:
        failed, ends = _without_peer_errors(failed, ends, statuses)
    if signal_received is not None:
        ends = _without_deaths_by(job_signal(signal_received), ends, set(infos))
        ends = _without_deaths_by(signal_received, ends, set(infos))
    agent_failure = _agent_failure(
        run_dir, returncode, signal_received, hang, single_process, statuses, node
    )
    external = signal_received is None and not hang and agent_failure is None
    _mark_late_ranks(run_dir, ends)
    cause = blame.find_cause(ends, signalled_from_outside=external)
    if agent_failure is not None:  # no rank failed: every one was interrupted
        failure = agent_failure
        failed = [r for r in failed if not rundir.is_peer_error(statuses[r])]
    elif cause is not None:
        first, others = cause
        failed = [first] + [r for r in others if r != first]
        lost = _node_lost(run_dir, infos.get(first)) if own and first not in own else None
        failure = _cause_failure(ends, statuses.get(first), first, others, lost)
    present = set(rundir.list_ranks(run_dir))
    present_here = present & own if own is not None else present
    elsewhere = _ranks_elsewhere(present, missing, infos, single_process, returncode)
    missing = [r for r in missing if r not in elsewhere]
    unwritten = missing if returncode == 0 and not failed and signal_received is None else []
    started = bool(statuses or infos)
    if hang:
        status = "hang"
    elif signal_received is not None and not _handled(
        single_process, returncode, statuses, missing
    ):
        status = "interrupted"
    else:
        status = (
            "failed" if failed or returncode != 0 or (missing and world and not unwritten) else "ok"
        )
    if status == "failed" and failure is None:
        failure = _failure_without_cause(run_dir, missing, started, returncode)
    if status == "failed" and started:
        # a rank without status.json died too (SIGABRT, OOM-kill); none started: no rank
        failed = failed + [r for r in missing if r not in failed]
    return {
        "status": status,
        "exit_code": _exit_code(status, returncode, signal_received, failure, single_process),
        "failed_ranks": failed,
        "failure": failure,
        "missing_status_ranks": missing,
        "unwritten_status_ranks": unwritten,
        "ranks_elsewhere": elsewhere,
        "traced_ranks": sorted(present_here),
        "untraced_ranks": [
            r for r in range(world) if r not in present and (own is None or r in own)
        ],
        "backend": next((i["backend"] for i in infos.values() if i.get("backend")), None),
        "init_method": _init_method(infos),
        "world_size": world or None,
        "rank_versions": infos[min(infos)].get("versions") if infos else None,
        "steps_completed": _steps_completed(run_dir, statuses, missing),
        "launcher_signal": blame.signal_name(signal_received) if signal_received else None,
    }


def _handled(
    single_process: bool, returncode: int, statuses: dict[int, dict[str, Any]], missing: list[int]
) -> bool:
    """One process whose script handled the signal and finished (exit 0, status ok): ok,
    as python says; torchrun ends its ranks on a signal, whatever they do."""
    return (
        single_process
        and returncode == 0
        and bool(statuses)
        and not missing
        and all(s.get("status") == "ok" for s in statuses.values())
    )


def _without_peer_errors(
    failed: list[int], ends: dict[int, blame.RankEnd], statuses: dict[int, dict[str, Any]]
) -> tuple[list[int], dict[int, blame.RankEnd]]:
    """The watchdog ended the stuck ranks, or this launcher was signalled and ended its
    own (another node's ranks then lose them): their peers' connection errors followed,
    and are no failure of their own."""
    failed = [r for r in failed if not rundir.is_peer_error(statuses[r])]
    ends = {
        r: e for r, e in ends.items() if not (e.failed and rundir.is_peer_error(e.status or {}))
    }
    return failed, ends


def _without_deaths_by(
    signum: int, ends: dict[int, blame.RankEnd], set_up: set[int]
) -> dict[int, blame.RankEnd]:
    """The launcher forwarded ``signum``: a rank that died of it without a status (it
    came before the rank had its handler: an mp.spawn worker still starting, probe 28i,
    F5), or whose process exited 128 + it (the mp.spawn parent's code given to the one
    rank it had started), was ended by the interrupt, not a failure of its own. So was
    one that died before gpudiag's set-up wrote anything of it (no rank_info.json, not in
    ``set_up``): python reports a KeyboardInterrupt during its start-up (a .pth file's
    import, sitecustomize) as "Fatal Python error: init_import_site" and exit 1, and
    rank 0 was blamed for it (probe 28j)."""
    name = blame.signal_name(signum)
    return {
        r: e
        for r, e in ends.items()
        if not (
            e.died_without_status
            and e.crash is None
            and (e.signal == name or e.exitcode in (-signum, 128 + signum) or r not in set_up)
        )
    }


# a rank's steps table is counted up to this many bytes when it left no status
STEPS_COUNT_MAX_BYTES = 64 << 20


def _steps_completed(
    run_dir: Path, statuses: dict[int, dict[str, Any]], no_status: list[int]
) -> dict[int, Any]:
    """Each rank's completed steps: from its status, or, for a rank that wrote none (it
    was SIGKILLed), the rows of its steps table."""
    steps = {r: s.get("steps_completed") for r, s in sorted(statuses.items())}
    for rank in no_status:
        path = rundir.table_path(rundir.rank_dir(run_dir, rank), rundir.STEPS)
        try:
            with rundir.open_regular(path) as table:  # never a FIFO's endless wait
                rows = table.read(STEPS_COUNT_MAX_BYTES).count(b"\n")
        except (OSError, ValueError):
            continue
        if rows:
            steps[rank] = rows
    return steps


def _ranks_elsewhere(
    present: set[int],
    missing: list[int],
    infos: dict[int, dict[str, Any]],
    single_process: bool,
    returncode: int,
) -> list[int]:
    """The ranks without a status that ran under another launcher. Exit 0 means every
    rank ended through gpudiag's worker with status ok: a rank of this directory without
    status.json then could not write it (full disk), it did not fail. A rank that left
    nothing here at all ran under another launcher (a script started once per rank with
    its own `gpudiag trace`), or untraced. The one process gpudiag started is the one
    rank here, whatever its exit code: the others ran elsewhere (ranks launched
    separately)."""
    alone = (
        single_process
        and len(present) == 1
        and all(infos.get(r, {}).get("started_by") == "gpudiag" for r in present)
    )
    return [r for r in missing if r not in present] if returncode == 0 or alone else []


def _mark_late_ranks(run_dir: Path, ends: dict[int, blame.RankEnd]) -> None:
    """After a collective timed out: the ranks that never reached it (their calls read
    from their tables only then)."""
    if any(e.timed_out for e in ends.values()):
        for end in ends.values():
            blame.read_calls(run_dir, end)
    blame.mark_late_ranks(ends)


def _mark_other_nodes_lost(
    run_dir: Path, ends: dict[int, blame.RankEnd], own: set[int], infos: dict[int, dict[str, Any]]
) -> None:
    """This node's ranks lost their connection: another node's ranks that left no status
    are the likely cause (that node was killed, crashed or lost its network). Not after
    a hang (the caller's rule): the other node's watchdog ended its ranks, and the hang
    report already names whom no watchdog saw."""
    if not any(
        e.failed and rundir.is_peer_error(e.status or {}) for r, e in ends.items() if r in own
    ):
        return
    for r, e in ends.items():
        if r not in own and e.status is None and not e.died_without_status:
            e.lost = _node_lost(run_dir, infos.get(r))


def _rank_documents(
    run_dir: Path,
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Each rank's status.json and rank_info.json that could be read."""
    statuses: dict[int, dict[str, Any]] = {}
    infos: dict[int, dict[str, Any]] = {}
    for r in rundir.list_ranks(run_dir):
        status = rundir.read_json(rundir.rank_dir(run_dir, r) / rundir.STATUS)
        info = rundir.read_json(rundir.rank_dir(run_dir, r) / rundir.RANK_INFO)
        if isinstance(status, dict):
            statuses[r] = status
        if isinstance(info, dict):
            infos[r] = info
    return statuses, infos


def _cause_failure(
    ends: dict[int, blame.RankEnd],
    status: dict[str, Any] | None,
    first: int,
    others: list[int],
    node_lost: str | None,
) -> dict[str, Any]:
    """The manifest's ``failure`` for the rank :func:`blame.find_cause` named. Ranks the
    job's shutdown then interrupted (torchrun's SIGTERM after the cause; a rank blocked
    in a collective ends so, not with a peer error) are consequences too."""
    ended = [r for r, e in sorted(ends.items()) if r != first and r not in others and e.interrupted]
    end, consequences = ends[first], [ends[r] for r in [*others, *ended]]
    if end.late_for is not None:
        failure = blame.late_failure(end, consequences)
    elif end.exited_zero:
        # it left the job with exit code 0 while its peers were still in it
        failure = blame.early_exit_failure(end, consequences)
    elif status is not None and end.interrupted:
        failure = blame.signalled_failure(end, consequences, node_lost)
    elif status is not None:
        failure = {
            "rank": first,
            "exc_type": status.get("exc_type"),
            "message": status.get("message"),
            "traceback": status.get("traceback"),
            "exit_code": status.get("exit_code"),
        }
    else:
        failure = blame.died_failure(end, consequences)
    failure["consequences"] = blame.consequence_rows(consequences)
    # when the cause ended: the failures of ranks launched separately are compared
    failure["end_ns"] = end.when_ns or None
    return failure


def _agent_failure(
    run_dir: Path,
    returncode: int,
    signal_received: int | None,
    hang: bool,
    single_process: bool,
    statuses: dict[int, dict[str, Any]],
    node: int | None,
) -> dict[str, Any] | None:
    """The manifest's ``failure`` when torchrun's agent, not a rank, ended the job: it died
    of a signal nobody in the job sent, or it was sent one from outside and ended its ranks
    with it (every rank interrupted, the launcher itself sent no signal)."""
    spawned = single_process and blame._spawn_parent(run_dir)
    if _agent_lost(returncode, signal_received, hang, single_process and not spawned, statuses):
        return _agent_lost_failure(returncode, _interrupted(statuses), spawned)
    if signal_received is not None or hang or not _all_interrupted(statuses):
        return None
    name = _agent_signal(run_dir, node)
    return _agent_signalled_failure(name, sorted(statuses)) if name is not None else None


def _agent_lost(
    returncode: int,
    signal_received: int | None,
    hang: bool,
    single_process: bool,
    statuses: dict[int, dict[str, Any]],
) -> bool:
    """torchrun's agent died of a signal nobody in the job sent (SIGKILL from outside) and
    every rank that wrote a status was interrupted at its death: their SIGTERM is the
    consequence, not a signal from outside, and the agent's death is the cause. (The agent
    also exits with a signal when a rank died unrecorded or at its own teardown, with
    ranks ok or missing: those stay as they were.)"""
    return (
        not single_process
        and not hang
        and signal_received is None
        and returncode < 0
        and _ended_with_parent(statuses)
    )


def _all_interrupted(statuses: dict[int, dict[str, Any]]) -> bool:
    return bool(statuses) and all(s.get("status") == "interrupted" for s in statuses.values())


def _interrupted(statuses: dict[int, dict[str, Any]]) -> list[int]:
    return sorted(r for r, s in statuses.items() if s.get("status") == "interrupted")


def _ended_with_parent(statuses: dict[int, dict[str, Any]]) -> bool:
    """Every rank was interrupted at its parent's death, or lost the connection to a peer
    that was (the peer's exit closed it first): all consequences of that death."""
    return bool(_interrupted(statuses)) and all(
        s.get("status") == "interrupted" or rundir.is_peer_error(s) for s in statuses.values()
    )


def _agent_signal(run_dir: Path, own_node: int | None) -> str | None:
    """The signal that ended this launcher's torchrun agent (``node<N>/agent_failures.json``,
    ``signal``), when the launcher sent none: from outside the job. Only its own node's:
    in a shared --out another node's agent may have been sent its launcher's signal."""
    from gpudiag.capture.agent import AGENT_FAILURES

    nodes = [own_node] if own_node is not None else rundir.list_nodes(run_dir)
    for node in nodes:
        data = rundir.read_json(rundir.node_dir(run_dir, node) / AGENT_FAILURES)
        if isinstance(data, dict) and isinstance(data.get("signal"), str):
            return str(data["signal"])
    return None


def _agent_signalled_failure(name: str, ended: list[int]) -> dict[str, Any]:
    """The manifest's ``failure`` when torchrun's agent received a signal gpudiag did not
    send and ended its ranks with it: probe 28d's SIGTERM to the agent blamed an
    arbitrary rank "ended by SIGTERM from outside the job (neither gpudiag, torchrun
    nor a failing peer sent it)", while torchrun had sent it to every rank."""
    ranks = f"; it ended its ranks {ended} with it" if ended else ""
    return {
        "rank": None,
        "exc_type": None,
        "message": (
            f"torchrun's agent (the process that starts and watches this node's ranks) "
            f"received {name}, which gpudiag did not send (from outside the job: a "
            f"scheduler, `kill`, a timeout?){ranks}"
        ),
        "traceback": None,
        "exit_code": 128 + int(signal.Signals[name]) if name in signal.Signals.__members__ else 1,
        "signal": name,
        "consequences": ended,
    }


_PARENTS = {
    False: "torchrun's agent (the process that starts and watches this node's ranks)",
    True: "the script's process that started the ranks with torch.multiprocessing.spawn",
}


def _agent_lost_failure(returncode: int, ended: list[int], spawned: bool) -> dict[str, Any]:
    """The manifest's ``failure`` when torchrun's agent, or the mp.spawn parent, died of a
    signal the launcher did not send: the probe's SIGKILL to the agent was reported as
    rank 1 "ended by SIGTERM from outside the job (neither gpudiag, torchrun nor a
    failing peer sent it)", an arbitrary rank and an untrue sentence (issue 28 probe,
    class 2); the mp.spawn parent's death as a rank's "SIGINT from outside the job", the
    parent-death SIGINT torch gives its workers (probe 28j, F1)."""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    ranks = f"; its ranks {ended} were ended with it" if ended else ""
    if ended and spawned:
        ranks += " (torch's parent-death SIGINT)"
    return {
        "rank": None,
        "exc_type": None,
        "message": (
            f"{_PARENTS[spawned]} died of {name}, which nobody in the job sent (killed from "
            f"outside: an OOM killer, a scheduler, `kill -9`?){ranks}"
        ),
        "traceback": None,
        "exit_code": 128 - returncode,
        "signal": name,
        "consequences": ended,
    }


def _failure_without_cause(
    run_dir: Path, missing: list[int], started: bool, returncode: int
) -> dict[str, Any]:
    """The manifest's ``failure`` of a failed run whose ranks name no cause."""
    if missing and started:
        message = (
            f"rank(s) {missing} ended without writing status.json (killed or crashed "
            f"in native code?); job exit code {returncode}"
        )
    elif not started:
        message = _rendezvous_error(run_dir) or (
            f"the job exited with {returncode} before any rank started "
            "(see the launcher's error, printed by `gpudiag trace` before its last line)"
        )
    else:
        message = f"every rank reported ok but the job exited with {returncode}"
    return {
        "rank": missing[0] if missing and started else None,
        "exc_type": None if started else rundir.LAUNCH_ERROR,
        "message": message,
        "traceback": None,
        "exit_code": returncode,
    }


def _init_method(infos: dict[int, dict[str, Any]]) -> str | None:
    """The ranks' rendezvous (rank_info ``init_method``) when they name one and agree."""
    methods = {
        i.get("init_method") for i in infos.values() if isinstance(i.get("init_method"), str)
    }
    return methods.pop() if len(methods) == 1 else None


def _node_lost(run_dir: Path, info: dict[str, Any] | None) -> str:
    """How another node ended, seen from here: its launcher gone, or just silent."""
    node = info.get("node_rank") if isinstance(info, dict) else None
    if not isinstance(node, int):
        return "its node sent no status (killed, crashed or cut off?)"
    received = rundir.read_json(rundir.node_dir(run_dir, node) / rundir.LAUNCHER_SIGNAL)
    if isinstance(received, dict) and isinstance(received.get("signal"), str):
        name = rundir.one_line(received["signal"])[:32]
        return rundir.signalled_node(node, f"received {name}")
    path = rundir.manifest_path(run_dir, node)
    manifest = rundir.read_json(path)
    if isinstance(manifest, dict) and manifest.get("status") == "running":
        why = rundir.launcher_gone(manifest, path)
        if why:
            return f"node {node} was lost ({why})"
    return f"node {node} sent no status for it (killed, crashed or cut off?)"


def _rendezvous_error(run_dir: Path) -> str | None:
    """The agent's one line when torchrun's rendezvous failed (agent_failures.json)."""
    from gpudiag.capture.agent import AGENT_FAILURES

    for node in rundir.list_nodes(run_dir):
        data = rundir.read_json(rundir.node_dir(run_dir, node) / AGENT_FAILURES)
        if isinstance(data, dict) and isinstance(data.get("rendezvous_error"), str):
            return str(data["rendezvous_error"])
    return None


def _node_ranks(
    infos: dict[int, dict[str, Any]], node: int, nproc_per_node: int | None, world: int
) -> set[int]:
    """The global ranks of ``node``: those whose rank_info says so and, for a rank that
    never wrote one, torchrun's numbering (node * nproc_per_node + local rank)."""
    own = {r for r, i in infos.items() if i.get("node_rank") == node}
    if nproc_per_node:
        block = range(node * nproc_per_node, min((node + 1) * nproc_per_node, world))
        own |= {r for r in block if r not in infos}
    return own


def _forwarded_signals() -> list[int]:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal or ssh session closed: the job runs in a
    session of its own, which no hang-up reaches, so it would train on with nobody to say
    how it ended), each unless the launcher was started with it ignored (``nohup``,
    ``cmd &`` in a shell script, ``trap '' INT``): then it is neither handled nor
    forwarded, and the job inherits the ignore, as under plain python (probe 28j, F4:
    15 of 17 traced runs were interrupted by a Ctrl-C that 8 of 8 plain runs ignored)."""
    return [
        s
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(s) is not signal.SIG_IGN
    ]


def ended_by_passed(run_dir: Path, returncode: int, passed: list[int]) -> int | None:
    """The signal, among those the launcher passed on to the processes that handle it
    (capture/user_signals), that ended the job: the job's process died of it (or exited
    128 + it), or a rank's status says it ended of it (gpudiag's stand-in for the
    default action, SIGALRM & co.: the rank wrote its status, then died of it). The job
    was then ended by the launcher's signal, as a Ctrl-C ends it, and no rank is to blame;
    None when the job ended otherwise (the script's handler ran, and the job went on)."""
    statuses, _ = _rank_documents(run_dir) if passed else ({}, {})
    for signum in passed:
        name = blame.signal_name(signum)
        if returncode in (-signum, 128 + signum):
            return signum
        if any(s.get("exc_type") == name for s in statuses.values()):
            return signum
    return None


def job_signal(signum: int) -> int:
    """What the job gets for the launcher's signal that ends it: a Ctrl-C or SIGTERM as
    it came; a hang-up, or a SIGQUIT & co. that no process of the job handles
    (capture/user_signals), ends it as SIGTERM does (torchrun's agent and the ranks
    handle SIGTERM; the others would kill them unrecorded)."""
    return signum if signum in (signal.SIGINT, signal.SIGTERM) else signal.SIGTERM


def _exit_code(
    status: str, rc: int, signum: int | None, failure: dict | None, single_process: bool
) -> int:
    if status == "interrupted" and signum is not None:
        if single_process and rc > 0 and rc != 128 + job_signal(signum):
            return rc  # the script's own handler chose its exit code (sys.exit(7))
        return 128 + signum
    failure_code = (failure or {}).get("exit_code")
    if status == "failed" and isinstance(failure_code, int) and failure_code > 0:
        return failure_code
    if rc < 0:  # killed by a signal
        return 128 - rc
    if status != "ok" and rc == 0:
        return 1
    return rc


def _incomplete_reasons(run_dir: Path, outcome: dict[str, Any], own: list[str]) -> list[str]:
    """Why the run's record is incomplete: the launcher's own write problems, each
    rank's (status.json ``incomplete``), ranks that exited 0 without status.json."""
    reasons = list(own)
    # this launcher's ranks only: in a shared --out another node's rank may still be
    # finishing (its interim status says so), and its launcher answers for it (probe 28d:
    # node 1's record named node 0's healthy ranks 0 and 1)
    traced = outcome.get("traced_ranks")
    ranks = traced if isinstance(traced, list) else rundir.list_ranks(run_dir)
    for r in ranks:
        status = rundir.read_json(rundir.rank_dir(run_dir, r) / rundir.STATUS)
        if isinstance(status, dict) and isinstance(status.get("incomplete"), list):
            reasons += [f"rank {r}: {x}" for x in status["incomplete"] if isinstance(x, str)]
    unwritten = outcome.get("unwritten_status_ranks") or []
    if unwritten:
        why = rundir.why_unwritable(rundir.rank_dir(run_dir, unwritten[0])).strerror
        reasons.append(
            f"rank(s) {unwritten} exited 0 but could not write status.json ({why or 'disk full?'})"
        )
    elsewhere = outcome.get("ranks_elsewhere") or []
    if elsewhere:
        reasons.append(
            f"rank(s) {elsewhere} of the world of {outcome.get('world_size')} left nothing in "
            "this directory: started by another launcher (trace each into its own --out and "
            "`gpudiag analyze` them side by side) or not traced"
        )
    return reasons
