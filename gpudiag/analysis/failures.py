"""Failures from a run directory: a rank that failed, a hang, a desync.

Sources: the manifest (status, failure), each rank's status.json, hang_report.json and
stacks.txt written by the hang watchdog, and the collectives table (per (pg, seq) the
op and sizes every rank called). All three kinds are high severity.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pandas as pd

from gpudiag import rundir
from gpudiag.analysis.findings import Finding, user_frame
from gpudiag.numfmt import clip_words

RANK_FAILED_FIX = (
    "Read the traceback of the first failing rank (the others were torn down after it). "
    "If it failed on a collective, check that every rank calls the same collectives with "
    "the same shapes; NCCL/gloo timeouts usually mean another rank diverged first."
)
LAUNCH_ERROR_FIX = (
    "No rank started: read the launcher's error (printed before gpudiag's last line), "
    "usually a torchrun option (--rdzv-backend, --rdzv-endpoint, --nnodes) or the "
    "environment it reads; no rank of the script is at fault."
)
EARLY_EXIT_FIX = (
    "The first rank ended with exit code 0 while the others still ran collectives: look "
    "for a rank-dependent sys.exit / os._exit / return (or a loop that ends sooner on "
    "that rank) before the others' last collective. Make every rank run the same "
    "collectives to the end (uneven inputs: DistributedSampler(drop_last=True) or "
    "DDP's join()), and destroy the process group only after the last one."
)
HANG_FIX = (
    "The ranks named as not inside the collective never reached it: look at their stack "
    "for the blocking call (data loading, a rank-dependent branch, an early exit). Make "
    "every rank call the same collectives in the same order; set a timeout in "
    "init_process_group(timeout=...) so a hang fails fast."
)
DESYNC_FIX = (
    "Ranks issued different collectives (or different sizes) at the same sequence "
    "number: look for rank-dependent control flow around collectives, uneven inputs "
    "(use DistributedSampler(drop_last=True) or DDP's join()), or parameters unused on "
    "some ranks (find_unused_parameters=True)."
)


def _failed_ranks(
    statuses: dict[int, dict[str, Any]], failure: dict[str, Any], hang: bool
) -> dict[int, dict[str, Any]]:
    failed: dict[int, dict[str, Any]] = {}
    for rank, status in statuses.items():
        if isinstance(status, dict) and rundir.is_failed(status.get("status")):
            failed[int(rank)] = status
    if hang:  # the watchdog ended the stuck ranks; their peers' connection errors followed
        failed = {r: s for r, s in failed.items() if not rundir.is_peer_error(s)}
        if rundir.is_peer_error(failure):
            return failed
    if failure.get("rank") is not None:
        try:
            failed.setdefault(int(failure["rank"]), failure)
        except (TypeError, ValueError):
            pass
    return failed


def rank_failed_findings(
    manifest: dict[str, Any] | None, statuses: dict[int, dict[str, Any]] | None
) -> list[Finding]:
    """The one ``rank_failed`` finding: from the manifest and the per-rank status
    documents (status.json from a full run, summary.json for a summaries-only analysis:
    both carry ``status``; only status.json has the traceback). Statuses per
    docs/run-format.md: only ``failed`` is a failure."""
    manifest = manifest or {}
    failure: dict[str, Any] = manifest.get("failure") or {}
    if not isinstance(failure, dict):
        failure = {}
    hang = manifest.get("status") == "hang"
    failed = _failed_ranks(statuses or {}, failure, hang)
    if hang and rundir.is_peer_error(failure):
        failure = {}
    if not failed and not rundir.is_failed(manifest.get("status")):
        return []
    first_rank = failure.get("rank")
    if first_rank is None:
        first_rank = _first_failed(failed, statuses or {})
        if first_rank is not None and first_rank not in failed:  # it left early
            status = (statuses or {})[first_rank]
            steps = status.get("steps_completed")
            peers = sorted(r for r in failed if rundir.is_peer_error(failed[r]))
            failure = rundir.early_exit_failure(
                first_rank, peers, steps if isinstance(steps, int) else None, None
            )
    # the cause ended with exit code 0 while its peers were still in the job
    early = first_rank is not None and failure.get("exc_type") == rundir.EARLY_EXIT
    # no rank started (a torchrun usage error): a launch error, no rank blamed
    launch = first_rank is None and failure.get("exc_type") == rundir.LAUNCH_ERROR
    detail = failed.get(first_rank, failure) if first_rank is not None else failure
    traceback = str(detail.get("traceback") or failure.get("traceback") or "")
    message = str(detail.get("message") or detail.get("error") or failure.get("message") or "")
    exc_type = detail.get("exc_type") or failure.get("exc_type")
    if exc_type and message and exc_type not in (rundir.EARLY_EXIT, rundir.LAUNCH_ERROR):
        message = f"{exc_type}: {message}"
    last_line = message or (traceback.strip().splitlines()[-1] if traceback.strip() else "")
    listed = _as_int_list(manifest.get("failed_ranks"))
    not_finished = [] if launch else sorted(set(failed) | set(listed))
    if not not_finished and first_rank is not None:
        not_finished = [int(first_rank)]
    # the finding names the cause; the others' failures followed from it (consequences)
    ranks = [int(first_rank)] if first_rank is not None else not_finished
    if early:
        # the message up to its explanation (the fix says what to do)
        said = last_line.split(": a rank that ")[0] or "left the job early (exit code 0)"
        title = clip_words(f"Rank {first_rank} {said}", 240)
    elif first_rank is not None and len(not_finished) > 1:
        title = f"Rank {first_rank} failed first ({len(not_finished)} ranks did not finish)"
    elif first_rank is not None:
        title = f"Rank {first_rank} failed"
    elif launch:
        title = "The job failed to launch (no rank started)"
    else:
        title = "The run failed"
    if last_line and not early:
        title += f": {clip_words(last_line, 160)}"
    return [
        Finding(
            kind="rank_failed",
            severity="high",
            cost_ms_per_step=0.0,
            ranks=ranks,
            title=title,
            evidence={
                "run_status": manifest.get("status"),
                "exit_code": manifest.get("exit_code", detail.get("exit_code")),
                "first_failed_rank": first_rank,
                "failed_ranks": not_finished,
                "error": last_line,
                # the cause and what followed from it (gpudiag/capture/blame.py)
                "cause_rank": first_rank,
                "signal": failure.get("signal"),
                "last_step": failure.get("last_step"),
                "consequences": failure.get("consequences") or [],
            },
            fix=EARLY_EXIT_FIX if early else LAUNCH_ERROR_FIX if launch else RANK_FAILED_FIX,
            # a fatal signal's stack (faulthandler: innermost frame first) has its own
            location=_frame_path(failure.get("location")) or user_frame(traceback),
        )
    ]


def _first_failed(
    failed: dict[int, dict[str, Any]], statuses: dict[int, dict[str, Any]]
) -> int | None:
    """Without the launcher's verdict (manifest ``failure``): the rank that failed first
    with an error of its own (not a peer's connection error), earliest end first, as
    gpudiag/capture/blame.py decides; else a rank that left the job early with exit
    code 0 while its peers were in it (``rundir.left_early``); else the earliest failed
    rank."""
    if not failed:
        return None
    early = rundir.left_early({r: s for r, s in statuses.items() if isinstance(s, dict)})
    if early and all(rundir.is_peer_error(s) for s in failed.values()):
        return early[0]

    def order(rank: int) -> tuple[bool, int, int]:
        status = failed[rank]
        end = status.get("end_ns")
        return (rundir.is_peer_error(status), end if isinstance(end, int) else 0, rank)

    return min(failed, key=order)


def _frame_path(value: Any) -> str | None:
    """ "file:line in func" -> "file:line"."""
    return value.split(" in ")[0] if isinstance(value, str) and value else None


def _as_int_list(value: Any) -> list[int]:
    out = []
    for v in value if isinstance(value, (list, tuple)) else []:
        try:
            out.append(int(v))
        except (TypeError, ValueError):
            continue
    return out


def _rank_states(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    states = report.get("ranks")
    out: dict[int, dict[str, Any]] = {}
    if isinstance(states, dict):
        for key, state in states.items():
            if isinstance(state, dict):
                try:
                    out[int(key)] = state
                except (TypeError, ValueError):
                    continue
    return out


def _unobserved_ranks(run: Any, states: dict[int, dict[str, Any]]) -> list[int]:
    """The job's ranks that no node's hang report covers (a node whose watchdog did not
    fire, wrote no report, or whose directory was not given)."""
    ranks = getattr(run, "ranks", None)
    if not states or not isinstance(ranks, list):
        return []
    world_size = getattr(run, "world_size", None)
    world = (
        set(range(world_size)) if isinstance(world_size, int) and world_size < 1 << 20 else set()
    )
    return sorted((world | set(ranks)) - set(states))


def _nodes_of(run: Any, ranks: list[int]) -> str:
    nodes = getattr(run, "rank_nodes", None) or {}
    named = sorted({nodes[r] for r in ranks if r in nodes})
    return f" (node {', '.join(map(str, named))})" if named else ""


def _first_inflight(states: dict[int, dict[str, Any]], ranks: list[int]) -> dict[str, Any]:
    calls = [
        c for r in ranks for c in (states.get(r, {}).get("inflight") or []) if isinstance(c, dict)
    ]
    calls.sort(key=lambda c: (c.get("seq") is None, c.get("seq") or 0))
    return calls[0] if calls else {}


def hang_findings(run: Any) -> list[Finding]:
    """From hang_report.json (gpudiag/capture/watchdog.py): ``stuck_ranks`` wait inside a
    collective, ``ranks_not_in_collective`` never reached it; ``desync`` when the
    waiting ranks called different collectives at the same sequence number."""
    report = getattr(run, "hang_report", None)
    if not isinstance(report, dict):
        return []
    states = _rank_states(report)
    waiting = _as_int_list(report.get("stuck_ranks"))
    absent = _as_int_list(report.get("ranks_not_in_collective"))
    unobserved = _unobserved_ranks(run, states)
    desync = report.get("desync") if isinstance(report.get("desync"), dict) else None
    call = _first_inflight(states, waiting)
    stacks = getattr(run, "stacks", None) or {}
    location = None
    for r in absent:
        location = location or states.get(r, {}).get("top_frame") or user_frame(stacks.get(r, ""))
    location = location or call.get("callsite")
    for r in waiting:
        location = location or states.get(r, {}).get("top_frame") or user_frame(stacks.get(r, ""))
    evidence = {
        "waiting_ranks": waiting,
        "ranks_not_in_collective": absent,
        "op": call.get("op"),
        "pg_name": call.get("pg_name"),
        "seq": call.get("seq"),
        "bytes": call.get("bytes"),
        "detected_after_s": report.get("detected_after_s"),
        "last_steps": {str(r): s.get("last_step") for r, s in sorted(states.items())},
    }
    verdict = str(report.get("verdict") or "the job stopped making progress")
    if unobserved and not absent:
        # every rank a watchdog saw waits: the cause is among the ranks no watchdog
        # reported on (another node's), not the waiting ones
        evidence["ranks_not_observed"] = unobserved
        verdict += (
            f"; rank(s) {', '.join(map(str, unobserved))}{_nodes_of(run, unobserved)} were "
            "not seen by a hang watchdog that fired: the likely cause"
        )
    if desync is not None:
        calls = desync.get("calls") if isinstance(desync.get("calls"), dict) else {}
        described = {
            str(r): (c.get("op"), str(c.get("shape")))
            for r, c in calls.items()
            if isinstance(c, dict)
        }
        values = list(described.values())
        common = max(set(values), key=values.count) if values else None
        odd = sorted(int(r) for r, v in described.items() if v != common) or waiting
        site = next(
            (c.get("callsite") for r, c in calls.items() if isinstance(c, dict) and int(r) in odd),
            None,
        )
        evidence.update(pg_name=desync.get("pg_name"), seq=desync.get("seq"), calls=described)
        return [
            Finding(
                kind="desync",
                severity="high",
                cost_ms_per_step=0.0,
                ranks=odd,
                title=f"Desync: {verdict}",
                evidence=evidence,
                fix=DESYNC_FIX,
                location=site or location,
            )
        ]
    return [
        Finding(
            kind="hang",
            severity="high",
            cost_ms_per_step=0.0,
            ranks=absent or unobserved or waiting,
            title=f"Hang: {verdict}",
            evidence=evidence,
            fix=HANG_FIX,
            location=location,
        )
    ]


# Collectives whose ranks pass different sizes when the call is right.
SIZES_MAY_DIFFER = frozenset(
    {
        "scatter",
        "gather",
        "scatter_object_list",
        "gather_object",
        "alltoall",
        "alltoall_base",
        "all_to_all",
        "all_to_all_single",
        "alltoallv",
    }
)


def collective_mismatches(collectives: pd.DataFrame) -> pd.DataFrame:
    """(pg_name, seq) where ranks disagree on the op or the sizes."""
    cols = {"rank", "pg_name", "seq", "op"}
    if collectives is None or collectives.empty or not cols <= set(collectives.columns):
        return pd.DataFrame(columns=["pg_name", "seq", "ops", "in_bytes", "ranks"])
    c = collectives.dropna(subset=["seq"]).copy()
    c["in_bytes"] = pd.to_numeric(c.get("in_bytes"), errors="coerce")
    # a rooted scatter or gather, or an all-to-all with splits, passes other sizes on
    # other ranks by design (the root's list, 0 B elsewhere): only its op is compared
    # (ninth probe: a correct dist.scatter, and every dcp.save, read as a HIGH desync)
    sized = ~c["op"].astype(str).str.lower().isin(SIZES_MAY_DIFFER)
    c.loc[~sized, "in_bytes"] = float("nan")
    c["pg_name"] = c["pg_name"].astype(str)
    g = c.groupby(["pg_name", "seq"], sort=True)
    counts = g.agg(
        n_ops=("op", "nunique"), n_bytes=("in_bytes", "nunique"), n_ranks=("rank", "nunique")
    )
    bad = counts[(counts["n_ops"] > 1) | (counts["n_bytes"] > 1)]
    if bad.empty:
        return pd.DataFrame(columns=["pg_name", "seq", "ops", "in_bytes", "ranks"])
    rows = []
    for (pg, seq), _ in bad.iterrows():
        part = c[(c["pg_name"] == pg) & (c["seq"] == seq)]
        rows.append(
            {
                "pg_name": pg,
                "seq": seq,
                "ops": {int(r): str(o) for r, o in zip(part["rank"], part["op"], strict=False)},
                "in_bytes": {
                    int(r): (None if pd.isna(b) else int(b))
                    for r, b in zip(part["rank"], part["in_bytes"], strict=False)
                },
                "ranks": sorted(int(r) for r in part["rank"]),
            }
        )
    return pd.DataFrame(rows)


def desync_findings(run: Any) -> list[Finding]:
    mism = collective_mismatches(getattr(run, "collectives", None))
    if mism.empty:
        return []
    first = mism.iloc[0]
    ops = first["ops"]
    sizes = first["in_bytes"]
    # The odd one out: ranks whose (op, size) differs from the most common one.
    # With a tie for the most common (2 ranks, 2 calls) there is no odd one out: every
    # rank is named (choosing one by set order named rank 0 or 1 depending on the
    # process's string hash seed).
    pairs = {r: (ops.get(r), sizes.get(r)) for r in sorted(first["ranks"])}
    counts = Counter(pairs.values())
    top = max(counts.values())
    leaders = [p for p, n in counts.items() if n == top]
    common = leaders[0] if len(leaders) == 1 else None
    odd = sorted(r for r, p in pairs.items() if p != common) or list(first["ranks"])
    return [
        Finding(
            kind="desync",
            severity="high",
            cost_ms_per_step=0.0,
            ranks=odd,
            title=(
                f"Desync at group {first['pg_name']} seq {int(first['seq'])}: ranks called "
                + ", ".join(f"{r}:{ops[r]}({sizes.get(r)} B)" for r in sorted(ops))
            ),
            evidence={
                "pg_name": first["pg_name"],
                "seq": int(first["seq"]),
                "ops": {str(k): v for k, v in ops.items()},
                "in_bytes": {str(k): v for k, v in sizes.items()},
                "mismatched_sequence_numbers": int(len(mism)),
            },
            fix=DESYNC_FIX,
        )
    ]


def failure_findings(run: Any | None) -> list[Finding]:
    if run is None:
        return []
    from gpudiag.analysis.mismatch import mismatch_findings

    # the collective that broke the run comes before the ranks that died of it
    findings = (
        mismatch_findings(run)
        + rank_failed_findings(run.manifest, run.statuses)
        + hang_findings(run)
    )
    if not any(f.kind == "desync" for f in findings):
        findings += desync_findings(run)
    return _cause_agrees_with_desync(findings)


def _desync_culprits(desync: Finding) -> tuple[list[int], bool]:
    """(the ranks a desync finding names as the ones that diverged, whether it names
    them): the mismatch's ``culprit_ranks`` (none on a tie), else the odd ranks out of
    the ranks whose calls it compared (all of them: no majority, no culprit)."""
    ev = desync.evidence
    if "culprit_ranks" in ev:
        culprits = _as_int_list(ev.get("culprit_ranks"))
        return culprits, bool(culprits) and ev.get("mismatch") != "tie"
    compared = ev.get("calls") if isinstance(ev.get("calls"), dict) else ev.get("ops")
    members = set(_as_int_list(list(compared))) if isinstance(compared, dict) else set()
    culprits = sorted(int(r) for r in desync.ranks)
    return culprits, bool(culprits) and bool(members) and not members <= set(culprits)


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _cause_agrees_with_desync(findings: list[Finding]) -> list[Finding]:
    """When a desync explains a failed run, the ``rank_failed`` finding names the same
    cause: the rank that skipped the collective or called it differently, not the rank
    gloo aborted inside it (gloo aborts the rank that *received* the odd data, which is
    often another one). The aborted rank, and the ranks that then lost the connection,
    are its consequences. On a tie (two ranks, no majority) no rank is the cause."""
    desync = next((f for f in findings if f.kind == "desync"), None)
    at = next((i for i, f in enumerate(findings) if f.kind == "rank_failed"), None)
    if desync is None or at is None:
        return findings
    failed = findings[at]
    ev = dict(failed.evidence)
    culprits, named = _desync_culprits(desync)
    observed = ev.get("cause_rank")  # the rank whose failure the launcher saw first
    dev = desync.evidence
    aborted = _as_int_list(dev.get("aborted_ranks"))
    # the rank seen failing first was aborted by gloo only when a signal ended it; one
    # that raised (TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprint check) failed by itself
    raised = isinstance(observed, int) and observed not in culprits and not ev.get("signal")
    if not aborted and isinstance(observed, int) and observed not in culprits and not raised:
        aborted = [observed]
    # a culprit gloo aborted in its own odd call is the cause, not a consequence
    aborted = [r for r in aborted if not (named and r in culprits)]
    where = f"{dev.get('op') or 'a collective'} seq {dev.get('seq')} (group {dev.get('pg_name')})"
    before = [c for c in ev.get("consequences") or [] if isinstance(c, dict)]
    signal = ev.get("signal")
    rows = [
        {
            "rank": r,
            "status": "died",
            "exc_type": signal if r == observed else None,
            "message": f"aborted by gloo inside {where}: a consequence of the collective "
            + (
                "mismatch, not its cause"
                if named
                else "mismatch (with no majority it may also be the rank that diverged)"
            ),
        }
        for r in aborted
    ]
    if raised and not (named and observed in culprits):
        error = str(ev.get("error") or "")
        rows.append(
            {
                "rank": observed,
                "status": "failed",
                "exc_type": error.split(":", 1)[0] or None,
                "message": error[:300] or None,
            }
        )
    shown = {row["rank"] for row in rows} | (set(culprits) if named else set())
    rows += [c for c in before if c.get("rank") not in shown]
    ev.update(
        cause="desync",
        cause_rank=culprits[0] if named and len(culprits) == 1 else None,
        cause_ranks=culprits if named else [],
        signal=None if named and observed not in culprits else signal,
        consequences=rows,
    )
    who = f"Rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))}"
    lost = sorted({r for c in rows if isinstance(r := c.get("rank"), int)} - set(aborted))
    parts = [f"gloo aborted {_ranks_text(aborted)} inside it"] if aborted else []
    parts += [f"{_ranks_text(lost)} then failed"] if lost else []
    after = f"; {' and '.join(parts)} (consequences)" if parts else ""
    if named:
        title = (
            f"{who} diverged at {where}, the collective mismatch above, and the run failed{after}"
        )
    else:
        title = (
            f"The run failed at a collective mismatch at {where} (above; no majority "
            f"says which of ranks {', '.join(map(str, desync.ranks))} diverged){after}"
        )
    fixed = replace(
        failed,
        ranks=culprits if named else sorted(int(r) for r in desync.ranks),
        title=title,
        evidence=ev,
        location=desync.location or failed.location,
    )
    return [*findings[:at], fixed, *findings[at + 1 :]]
