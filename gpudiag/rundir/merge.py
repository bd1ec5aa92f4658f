"""Multi-node and separately launched parts: their manifests and loaded runs merged
into one, and which rank's end caused a merged job's failure."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudiag.rundir.discover import _separately_launched
from gpudiag.rundir.layout import _worst_status, is_failed, is_peer_error, manifest_node
from gpudiag.rundir.read import merge_hang_reports
from gpudiag.rundir.schema import Run, _is_int

# --------------------------------------------------------------------------- multi-node
# One multi-node job: every launcher writes into one shared run directory (node 0's
# manifest.json, the others' manifest.node<K>.json), or each into its own directory
# (`gpudiag analyze node0_dir node1_dir`, or their parent). Either way the reader sees
# one run.


def merge_manifests(
    parts: Sequence[tuple[int, dict[str, Any]]],
    statuses: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """One job's manifest from its nodes' (node rank, manifest): the lowest node's
    (node 0's), with every other node's under ``nodes`` ({node: manifest}), every
    node's ``hosts``, the worst status, and the union of failed ranks and steps. A
    failure and exit code come from node 0 unless only another node has one.

    Ranks launched separately (:func:`_separately_launched`: every part says node 0)
    are ordered by their lowest traced rank, and the failure is decided again across
    the parts (:func:`decide_failure`, with the ranks' ``statuses`` when given): each
    launcher saw only its own rank, so the order of the arguments must not pick it."""
    apart = len(parts) > 1 and _separately_launched([m for _, m in parts])
    ordered = sorted(parts, key=lambda p: (p[0], _lowest_rank(p[1]) if apart else 0))
    main = dict(ordered[0][1])
    others = ordered[1:]
    if not others:
        return main
    nodes = dict(main.get("nodes") or {})
    nodes.update({n: m for n, m in others})
    main["nodes"] = nodes
    manifests = [m for _, m in ordered]
    hosts: list[Any] = []
    for m in manifests:
        hosts += [h for h in m.get("hosts") or [] if isinstance(h, dict)]
    main["hosts"] = hosts
    main["status"] = _worst_status(m.get("status") for m in manifests) or main.get("status")
    sizes = [w for m in manifests if isinstance(w := m.get("world_size"), int) and w > 0]
    if sizes:
        main["world_size"] = max(sizes)
    steps: dict[str, Any] = {}
    failed: list[Any] = []
    for m in manifests:
        if isinstance(m.get("steps_completed"), dict):
            steps.update(m["steps_completed"])
        failed += [r for r in m.get("failed_ranks") or [] if r not in failed]
    main["steps_completed"] = dict(sorted(steps.items(), key=lambda kv: str(kv[0])))
    main["failed_ranks"] = failed
    if apart:
        _decide_merged_failure(main, manifests, statuses)
    elif main.get("failure") is None:
        other = next((m for m in manifests if isinstance(m.get("failure"), dict)), None)
        if other is not None:
            main["failure"] = other["failure"]
            main["exit_code"] = other.get("exit_code")
    else:
        _lost_node_interrupted(main, others)
    if apart:
        incomplete, main["ranks_elsewhere"] = _apart_incomplete(manifests)
    else:
        incomplete = [x for m in manifests for x in m.get("incomplete") or []]
    main["incomplete"] = incomplete or None
    traced = sorted({r for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)})
    if traced:
        main["traced_ranks"] = traced
        size = main.get("world_size")
        if isinstance(size, int):
            main["untraced_ranks"] = [r for r in range(size) if r not in traced]
    return main


def _lost_node_interrupted(main: dict[str, Any], others: Sequence[tuple[int, Any]]) -> None:
    """Node 0's launcher blamed another node's rank that left it no status ("node 1 sent
    no status for it (killed, crashed or cut off?)": in per-node directories it cannot see
    that node's files). When that node's own manifest says its launcher was interrupted,
    say so (probe 28c: node 1's launcher got SIGTERM, its rank's status and its manifest
    were in its own directory)."""
    failure = main.get("failure")
    if not isinstance(failure, dict) or failure.get("exc_type") != "node_lost":
        return
    rank = failure.get("rank")
    for node, manifest in others:
        traced = manifest.get("traced_ranks") if isinstance(manifest, Mapping) else None
        if not (isinstance(traced, list) and rank in traced):
            continue
        if manifest.get("status") != "interrupted":
            return
        code = manifest.get("exit_code")
        how = _signal_of_exit(code)
        step = failure.get("last_step")
        during = f" during step {step + 1}" if _is_int(step) and isinstance(step, int) else ""
        main["failure"] = {
            **failure,
            "message": f"was ended{during}: {signalled_node(node, how)} (a Ctrl-C or `kill` "
            "on that node)",
        }
        return


def _lost_node_unfinished(manifest: dict[str, Any], parts: Sequence[Run]) -> None:
    """A launcher blamed another node's rank that left it no status ("stopped with no step
    of it recorded here without writing its status"), and that node's directory holds the
    rank's status and steps but a manifest its launcher never finished: the launcher was
    killed (probe 28d: node 1's launcher SIGKILLed, one --out per node; the same for node
    0's). Say what the node's own files say."""
    failure = manifest.get("failure")
    if not isinstance(failure, dict) or failure.get("exc_type") != "node_lost":
        return
    rank = failure.get("rank")
    part = next((r for r in parts if isinstance(rank, int) and rank in r.statuses), None)
    if part is None or part.manifest.get("status") not in (None, "running", "launcher_lost"):
        return
    own = part.statuses[int(rank)]  # type: ignore[arg-type]
    steps = own.get("steps_completed")
    ended = own.get("exc_type") or own.get("status") or "ended"
    after = f" after {steps} step(s)" if isinstance(steps, int) else ""
    manifest["failure"] = {
        **failure,
        "message": (
            f"was ended ({ended}){after} with its node: node {manifest_node(part.manifest)}'s "
            "gpudiag launcher stopped without finishing its record (killed: `kill -9`, an OOM "
            "killer, a lost host?)"
        ),
        "last_step": steps - 1
        if isinstance(steps, int) and steps > 0
        else failure.get("last_step"),
    }


def signalled_node(node: int, how: str) -> str:
    """The one wording of a node whose launcher was signalled and ended its ranks (the
    launcher's record, from node<N>/launcher_signal.json, and a merged run's, from that
    node's manifest): ``how`` is "received SIGTERM" or "was interrupted"."""
    return f"node {node}'s gpudiag launcher {how} and ended its ranks with it"


def _signal_of_exit(code: Any) -> str:
    """ "received SIGTERM" for an exit code of 143; "was interrupted" when no signal's."""
    if _is_int(code) and 128 < code < 160:
        try:
            return f"received {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return "was interrupted"


def _own_incomplete(manifest: Mapping[str, Any]) -> list[Any]:
    """A separately launched part's ``incomplete`` reasons without its launcher's "rank(s)
    [...] left nothing in this directory: started by another launcher": read with the
    other parts, those ranks are in another part, or named once for the whole run
    (:func:`_apart_incomplete`)."""
    reasons = list(manifest.get("incomplete") or [])
    elsewhere = manifest.get("ranks_elsewhere")
    if not isinstance(elsewhere, list) or not elsewhere:
        return reasons
    note = f"rank(s) {elsewhere} of the world of "
    return [
        x
        for x in reasons
        if not (isinstance(x, str) and x.startswith(note) and "left nothing in this" in x)
    ]


def _apart_incomplete(manifests: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[int]]:
    """The ``incomplete`` reasons and ``ranks_elsewhere`` of separately launched parts read
    as one run: each part's own reasons, less its note on the ranks it left to the other
    launchers; the ranks of the world that no part traced, named once."""
    traced = {r for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)}
    reasons = [x for m in manifests for x in _own_incomplete(m)]
    missing = sorted(
        {
            r
            for m in manifests
            for r in m.get("ranks_elsewhere") or []
            if _is_int(r) and r not in traced
        }
    )
    if missing:
        sizes = [w for m in manifests if isinstance(w := m.get("world_size"), int)]
        reasons.append(
            f"rank(s) {missing} of the world of {max(sizes) if sizes else '?'} left nothing "
            "in any of the directories given: started by another launcher (give its --out "
            "too) or not traced"
        )
    return reasons, missing


def _apart_warnings(part: Run) -> list[str]:
    """A separately launched part's warnings, its "run incomplete" note (written when its
    manifest was read alone) redone without its note on the ranks it left to the other
    launchers (:func:`_own_incomplete`)."""
    reasons = part.manifest.get("incomplete")
    if not isinstance(reasons, list) or not reasons:
        return list(part.warnings)
    own = _own_incomplete(part.manifest)
    if len(own) == len(reasons):
        return list(part.warnings)

    def note(items: list[Any]) -> str:
        shown = "; ".join(str(x) for x in items[:3])
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        return f"run incomplete: {shown}{more}"

    old, new = note(reasons), note(own) if own else None
    out: list[str] = []
    for w in part.warnings:
        if w.startswith(str(part.path)) and w.endswith(f": {old}"):
            if new is not None:
                out.append(w[: -len(old)] + new)
            continue
        out.append(w)
    return out


def _lowest_rank(manifest: Mapping[str, Any]) -> int:
    """The lowest rank a separately launched part traced (the order of the parts)."""
    listed = manifest.get("traced_ranks")
    traced = [r for r in listed if _is_int(r)] if isinstance(listed, list) else []
    return min(traced) if traced else 1 << 62


# --------------------------------------------------------------------------- the cause
# Which rank caused a failed job. The launcher decides it when the job ends
# (gpudiag/capture/blame.py, with the agent's exit codes and the order of deaths); the
# functions below decide it again from the ranks' statuses and the parts' failures when
# one launcher saw only part of the job (ranks launched separately), and for `analyze`.

EARLY_EXIT = "early_exit"  # a failure's exc_type: the rank left the job with exit code 0
# a failure's exc_type: the job ended before any rank started (a torchrun usage error,
# an unknown rendezvous backend): no rank failed
LAUNCH_ERROR = "launch_error"
# a failure's exc_type when the rank ended without an error of its own
_ENDED_TYPES = frozenset({"died", "node_lost", "KeyboardInterrupt", EARLY_EXIT})


def cause_kind(failure: Mapping[str, Any]) -> int:
    """How a failure (a status.json, or a manifest's ``failure``) ranks as the cause of
    a failed job: 0 an error of the rank's own, 1 the rank died, was ended by a signal or
    left the job early with exit code 0 (its peers then lost their connection), 2 a
    peer's connection error (a consequence of another rank's end)."""
    if is_peer_error(failure):
        return 2
    exc = failure.get("exc_type")
    if (
        failure.get("signal")
        or failure.get("status") == "interrupted"
        or exc in _ENDED_TYPES
        or (isinstance(exc, str) and exc.startswith("SIG"))
    ):
        return 1
    return 0


def _end_ns(status: Any) -> int | None:
    end = status.get("end_ns") if isinstance(status, Mapping) else None
    return end if _is_int(end) else None


def left_early(statuses: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Ranks that ended ok (exit code 0) before any rank failed, in a job whose failures
    include a peer's connection error: they left while their peers still needed them
    (``sys.exit(0)``, a return before a collective the others are in), the peers'
    connection errors followed. Earliest first. A rank that ended ok after a peer had
    failed, or in a job with no peer error, is never one."""
    ends = {r: e for r, s in statuses.items() if (e := _end_ns(s)) is not None}
    failed = [r for r in ends if is_failed(statuses[r].get("status"))]
    if not any(is_peer_error(statuses[r]) for r in failed):
        return []
    first = min(ends[r] for r in failed)
    early = [r for r in ends if statuses[r].get("status") == "ok" and ends[r] < first]
    return sorted(early, key=lambda r: (ends[r], r))


def early_exit_failure(
    rank: int,
    peers: Sequence[int],
    steps: int | None,
    end_ns: int | None,
    without_status: bool = False,
) -> dict[str, Any]:
    """The manifest's ``failure`` for a rank that left the job with exit code 0 while
    its peers were still in it (``steps``: the steps it completed)."""
    how = "exit code 0, no status written: os._exit(0)?" if without_status else "exit code 0"
    after = f" after {steps} step(s)" if steps is not None else ""
    message = f"left the job early ({how}){after} while its peers were still in it"
    if peers:
        ranks = ", ".join(str(r) for r in peers)
        message += (
            f"; rank{'s' if len(peers) > 1 else ''} {ranks} then lost the connection to it "
            "(a consequence, not the cause)"
        )
    message += (
        ": a rank that returns or calls sys.exit(0) / os._exit(0) before its peers' last "
        "collective leaves them without a partner"
    )
    return {
        "rank": rank,
        "exc_type": EARLY_EXIT,
        "message": message,
        "traceback": None,
        "exit_code": 0,
        "signal": None,
        "last_step": steps - 1 if steps else None,
        "end_ns": end_ns,
    }


def _ended_without_status(
    parts: Sequence[Run], statuses: Mapping[int, Any]
) -> dict[int, dict[str, Any]]:
    """A separately launched rank whose launcher ended ok (exit code 0) but that wrote
    no status.json (``os._exit(0)``): what its steps table says of its end."""
    out: dict[int, dict[str, Any]] = {}
    for part in parts:
        if part.manifest.get("status") != "ok" or part.steps is None or not len(part.steps):
            continue
        for r in part.manifest.get("missing_status_ranks") or []:
            if not _is_int(r) or r in statuses or "rank" not in part.steps:
                continue
            rows = part.steps[part.steps["rank"] == r]
            if len(rows) and "end_ns" in rows:
                out[r] = {
                    "status": "ok",
                    "exit_code": 0,
                    "end_ns": int(rows["end_ns"].max()),
                    "steps_completed": len(rows),
                    "no_status": True,
                }
    return out


def _decide_merged_failure(
    main: dict[str, Any],
    manifests: Sequence[Mapping[str, Any]],
    statuses: Mapping[int, Mapping[str, Any]] | None,
) -> None:
    """The failure of ranks launched separately, decided across every part: a rank with
    an error of its own, then one that died, was signalled or left early, then a peer's
    connection error; among equals the earliest end, then the lowest rank."""
    statuses = statuses or {}
    part_of = {r: m for m in manifests for r in m.get("traced_ranks") or [] if _is_int(r)}
    found: dict[int, tuple[int, int, dict[str, Any]]] = {}
    for m in manifests:
        f = m.get("failure")
        if not isinstance(f, dict) or not _is_int(f.get("rank")):
            continue
        end = _end_ns(f) or _end_ns(statuses.get(f["rank"])) or _end_ns(m) or 0
        found[f["rank"]] = (cause_kind(f), end, f)
    early = [r for r in left_early(statuses) if r not in found]
    peers = sorted(
        (r for r, (kind, _, _) in found.items() if kind == 2), key=lambda r: (found[r][1], r)
    )
    for r in early:
        s = statuses[r]
        steps = s.get("steps_completed") if _is_int(s.get("steps_completed")) else None
        failure = early_exit_failure(r, peers, steps, _end_ns(s), bool(s.get("no_status")))
        found[r] = (1, _end_ns(s) or 0, failure)
    if not found:
        return
    order = sorted(found, key=lambda r: (found[r][0], found[r][1], r))
    cause = order[0]
    failure = dict(found[cause][2])
    before = failure.get("consequences")
    rows = [c for c in before if isinstance(c, dict)] if isinstance(before, list) else []
    seen = {cause, *(c.get("rank") for c in rows)}
    for r in order[1:]:
        if r in seen:
            continue
        other = found[r][2]
        status = statuses.get(r)
        rows.append(
            {
                "rank": r,
                "status": status.get("status") if isinstance(status, Mapping) else "failed",
                "exc_type": other.get("exc_type"),
                "message": str(other.get("message") or "")[:300] or None,
            }
        )
    failure["consequences"] = rows
    main["failure"] = failure
    codes = [part_of[r].get("exit_code") for r in order if r in part_of]
    code = next((c for c in codes if _is_int(c) and c != 0), None)
    if code is not None:
        main["exit_code"] = code
    failed = main.get("failed_ranks")
    main["failed_ranks"] = order + [
        r for r in (failed if isinstance(failed, list) else []) if r not in order
    ]


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    full = [f for f in frames if len(f)]
    if not full:
        return frames[0]
    return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0]


def merge_runs(runs: Sequence[Run], path: Path) -> Run:
    """The per-node directories of one job read as one run (ranks and nodes are
    disjoint: each node wrote its own)."""
    apart = _separately_launched([r.manifest for r in runs])
    parts = sorted(
        runs, key=lambda r: (manifest_node(r.manifest), _lowest_rank(r.manifest) if apart else 0)
    )
    statuses = {k: v for r in parts for k, v in r.statuses.items()}
    if apart:
        statuses.update(_ended_without_status(parts, statuses))
    manifest = merge_manifests([(manifest_node(r.manifest), r.manifest) for r in parts], statuses)
    _lost_node_unfinished(manifest, parts)
    merged = Run(
        path=path,
        manifest=manifest,
        steps=_concat([r.steps for r in parts]),
        collectives=_concat([r.collectives for r in parts]),
        regions=_concat([r.regions for r in parts]),
        ddp_stats=_concat([r.ddp_stats for r in parts]),
        gpu_samples=_concat([r.gpu_samples for r in parts]),
        host_samples=_concat([r.host_samples for r in parts]),
        lint=next((r.lint for r in parts if r.lint is not None), None),
        hang_report=merge_hang_reports(
            [(manifest_node(r.manifest), r.hang_report) for r in parts if r.hang_report]
        ),
        warnings=[w for r in parts for w in r.warnings],
    )
    if apart:  # a part's ranks elsewhere are in another part, or named once here
        merged.warnings = [w for r in parts for w in _apart_warnings(r)]
        if manifest.get("ranks_elsewhere"):
            merged.warnings.append(f"{path}: run incomplete: {manifest['incomplete'][-1]}")
    for r in parts:
        merged.rank_info.update(r.rank_info)
        merged.statuses.update(r.statuses)
        merged.summaries.update(r.summaries)
        merged.trace_files.update(r.trace_files)
        merged.stacks.update(r.stacks)
        merged.clock_offsets.update(r.clock_offsets)
    merged.parts = [r.path for r in parts]
    return merged
