"""The collective that broke a failed run, and the rank that did not match it.

When ranks disagree at one collective (one rank skipped an all_reduce and its next
collective met the others' one; the same op with different sizes), gloo aborts one rank
in C++ (SIGABRT, "Received data size doesn't match") and the others get "Connection
reset by peer". The aborted rank is not necessarily the culprit. Per rank this module
takes the collective it was in when the run failed:

- the failed call recorded by gpudiag's patched ``torch.distributed`` (op, group, seq,
  bytes, the user's line) in ``collective_times.jsonl``;
- for a rank that aborted: faulthandler's stack of the abort (the torch.distributed
  function and the user's line) in ``stacks.txt``;
- the Flight Recorder row at that (group, seq) in ``collectives.jsonl`` (op and bytes,
  also for DDP's own bucket all-reduces, which have no user line).

The culprit is the rank whose call differs from the others' (by line, then by size).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag import frames, rundir
from gpudiag.analysis.findings import Finding

_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
FIX = (
    "Every rank must call the same collectives, in the same order, with the same sizes. "
    "Look for rank-dependent branches around the named line (an `if rank == ...` that "
    "skips or adds a collective, uneven data so that one rank runs one step fewer or "
    "more, per-rank tensor sizes); DistributedSampler(drop_last=True) or DDP's join() "
    "handle uneven inputs."
)


@dataclass
class Call:
    rank: int
    how: str  # "raised", "aborted", "flight_recorder"
    op: str | None = None
    pg: str | None = None
    seq: int | None = None
    bytes: int | None = None
    callsite: str | None = None  # "file:line in func"

    @property
    def line(self) -> str | None:
        """The call's ``file:line`` for comparing ranks: the file by its name alone, since
        one script's path differs between ranks started differently (``train.py`` for the
        rank gpudiag started, ``/home/u/train.py`` for one a framework re-executed) or on
        nodes with their checkouts in different folders."""
        if not self.callsite:
            return None
        path, _, lineno = self.callsite.split(" in ")[0].rpartition(":")
        return f"{os.path.basename(path)}:{lineno}" if path else self.callsite


def _rank_root(run: Any, rank: int) -> Path:
    """The directory that holds ``rank<R>/``: of a merged run (the directories of one
    job's nodes, or of ranks launched separately, ``run.parts``) the part that traced the
    rank, else the run's own directory."""
    for part in getattr(run, "parts", None) or []:
        if rundir.lexists(rundir.rank_dir(part, rank)):
            return Path(part)
    return Path(run.path)


def _error_call(run: Any, rank: int) -> Call | None:
    path = rundir.table_path(rundir.rank_dir(_rank_root(run, rank), rank), rundir.COLLECTIVE_TIMES)
    last = None
    for row in rundir.iter_jsonl(path):
        if row.get("error"):
            last = row
    if last is None:
        return None
    return Call(
        rank,
        "raised",
        str(last.get("op") or "") or None,
        None if last.get("pg_name") is None else str(last.get("pg_name")),
        last["seq"] if isinstance(last.get("seq"), int) else None,
        last["bytes"] if isinstance(last.get("bytes"), int) else None,
        last.get("callsite") if isinstance(last.get("callsite"), str) else None,
    )


def _aborted_call(run: Any, rank: int) -> Call | None:
    """The rank's thread that was inside torch.distributed when faulthandler wrote the
    fatal error (gloo aborts on its own thread: every Python thread is listed)."""
    text = (getattr(run, "stacks", None) or {}).get(rank) or ""
    at = text.rfind("Fatal Python error:")
    if at < 0:
        return None
    for block in re.split(r"\n\s*\n", text[at:]):
        op = callsite = None
        for line in block.splitlines():  # innermost first
            m = _FRAME_RE.match(line)
            if not m:
                continue
            if op is None and frames.in_module(m["file"], "torch.distributed"):
                op = m["func"]
            if op is not None and frames.is_user_file(m["file"]):
                callsite = f"{m['file']}:{m['line']} in {m['func']}"
                break
        if op is not None:
            return Call(rank, "aborted", op, callsite=callsite)
    return None


def _entered_call(run: Any, rank: int) -> Call | None:
    """The call the rank had entered last (its last_call.json): for a rank that died in
    it (gloo aborted it), what it was passing."""
    doc = rundir.read_last_call(_rank_root(run, rank), rank, run.warnings)
    if doc is None or not isinstance(doc.get("seq"), int) or doc.get("pg_name") is None:
        return None
    size = doc.get("bytes")
    site = doc.get("callsite")
    return Call(
        rank,
        "aborted",
        str(doc.get("op") or "") or None,
        str(doc["pg_name"]),
        doc["seq"],
        size if isinstance(size, int) and not isinstance(size, bool) else None,
        site if isinstance(site, str) else None,
    )


def _fr_row(run: Any, rank: int, pg: str, seq: int) -> dict[str, Any] | None:
    c = getattr(run, "collectives", None)
    if c is None or c.empty or not {"rank", "pg_name", "seq"} <= set(c.columns):
        return None
    part = c[(c["rank"] == rank) & (c["pg_name"].astype(str) == pg) & (c["seq"] == seq)]
    return None if part.empty else part.iloc[0].to_dict()


def failed_calls(run: Any) -> tuple[str, int, dict[int, Call]] | None:
    """(pg, seq, each rank's call there) for the first collective that failed."""
    ranks = sorted(set(getattr(run, "rank_info", {}) or {}) | set(run.statuses or {}))
    raised = {r: c for r in ranks if (c := _error_call(run, r)) is not None}
    located = [c for c in raised.values() if c.seq is not None and c.pg is not None]
    # a rank that died in the call (no status: gloo aborted it) left what it had entered
    statuses = run.statuses or {}
    dead = [r for r in ranks if r not in statuses]
    entered = {r: c for r in dead if (c := _entered_call(run, r)) is not None}
    located += entered.values()
    if not located:
        return None
    first = min(located, key=lambda c: (c.seq, c.pg))
    pg, seq = first.pg, first.seq
    assert pg is not None and seq is not None
    calls: dict[int, Call] = {}
    for r in ranks:
        call = raised.get(r)
        if call is not None and (call.pg, call.seq) != (pg, seq):
            call = None
        died_in = entered.get(r) if call is None else None
        if died_in is not None and (died_in.pg, died_in.seq) != (pg, seq):
            died_in = None
        call = call or _aborted_call(run, r)
        if died_in is not None:
            if call is not None:  # faulthandler's stack of the abort: keep its line
                died_in.callsite = call.callsite or died_in.callsite
            call = died_in
        row = _fr_row(run, r, pg, seq)
        if call is None and row is not None:
            call = Call(r, "flight_recorder", callsite=None)
        if call is None:
            continue
        if row is not None:
            call.op = call.op or row.get("op")
            if call.bytes is None and row.get("in_bytes") == row.get("in_bytes"):  # not NaN
                call.bytes = int(row["in_bytes"]) if row.get("in_bytes") is not None else None
            if call.how == "aborted":
                call.pg, call.seq = pg, seq
        calls[r] = call
    return pg, seq, calls


def _lines(calls: dict[int, Call]) -> dict[int, str]:
    """Each rank's line for the vote. A call seen only in the Flight Recorder has no user
    line: that is not evidence of a different line. It counts as the common line when its
    op and size are those of the common call (a waiting rank of a hang, its Python stack
    not recorded), as a different line when its op or size differ (DDP's bucket all-reduce
    met by a rank that skipped a collective), and not at all when a size is unknown."""
    with_line = {r: c.line for r, c in calls.items() if c.line}
    if not with_line:
        return {r: f"<{c.op} without a user line>" for r, c in calls.items()}
    common = Counter(with_line.values()).most_common(1)[0][0]
    ref = next(calls[r] for r, line in sorted(with_line.items()) if line == common)
    lines: dict[int, str] = {}
    for r, c in calls.items():
        if c.line:
            lines[r] = c.line
        elif c.how != "flight_recorder" or (c.op and ref.op and c.op != ref.op):
            lines[r] = f"<{c.op} without a user line>"
        elif c.bytes is None or ref.bytes is None:
            continue
        elif c.bytes == ref.bytes:
            lines[r] = common
        else:
            lines[r] = f"<{c.op} without a user line>"
    return lines


def _odd_ones(calls: dict[int, Call]) -> tuple[list[int], str] | None:
    """The ranks whose call differs from the most common one, and how."""
    by_line = _lines(calls)
    common_line, n = Counter(by_line.values()).most_common(1)[0]
    odd = sorted(r for r, line in by_line.items() if line != common_line)
    if odd and n > len(odd):
        return odd, "line"
    sizes = {r: c.bytes for r, c in calls.items() if c.bytes is not None}
    if len(set(sizes.values())) > 1:
        common_size, n = Counter(sizes.values()).most_common(1)[0]
        odd = sorted(r for r, b in sizes.items() if b != common_size)
        if n > len(odd):
            return odd, "size"
    unknown = sorted(r for r, c in calls.items() if c.bytes is None)
    if len(sizes) >= 2 and len(set(sizes.values())) == 1 and unknown:
        return unknown, "size_unknown"  # every size seen agrees: the unseen one differs
    if len(set(by_line.values())) > 1 or len(set(sizes.values())) > 1:
        return [], "tie"  # they differ, and no majority says who (two ranks, or a split)
    return None


def _path_line(callsite: str | None) -> str | None:
    """ "file:line in func" -> "file:line"."""
    return callsite.split(" in ")[0] if callsite else None


def _describe(c: Call) -> str:
    size = f" {c.bytes} B" if c.bytes is not None else ""
    where = f" at {c.callsite}" if c.callsite else " (no user line: DDP's gradient bucket)"
    return f"{c.op or 'a collective'}{size}{where}"


def _evidence_calls(calls: dict[int, Call]) -> dict[str, dict[str, Any]]:
    return {
        str(r): {"op": c.op, "bytes": c.bytes, "callsite": c.callsite, "how": c.how}
        for r, c in sorted(calls.items())
    }


def _tie_finding(pg: str, seq: int, calls: dict[int, Call]) -> Finding:
    """The ranks' calls differ and no majority names the odd one (two ranks): each rank's
    call is shown, with its line, and no rank is blamed."""
    aborted = sorted(r for r, c in calls.items() if c.how == "aborted")
    title = (
        f"Collective mismatch at seq {seq} (group {pg}): "
        + "; ".join(f"rank {r} called {_describe(c)}" for r, c in sorted(calls.items()))
        + f". With {len(calls)} ranks and no majority, either may be the one that diverged"
    )
    if aborted:
        title += (
            f" (gloo aborted rank{'s' if len(aborted) > 1 else ''} {', '.join(map(str, aborted))})"
        )
    site = next((c.callsite for _, c in sorted(calls.items()) if c.callsite), None)
    return Finding(
        kind="desync",
        severity="high",
        cost_ms_per_step=0.0,
        ranks=sorted(calls),
        title=title,
        evidence={
            "pg_name": pg,
            "seq": seq,
            "op": next((c.op for c in calls.values() if c.op), None),
            "culprit_ranks": [],
            "mismatch": "tie",
            "aborted_ranks": aborted,
            "calls": _evidence_calls(calls),
        },
        fix=FIX,
        location=_path_line(site),
    )


def mismatch_findings(run: Any | None) -> list[Finding]:
    if run is None or getattr(run, "path", None) is None:
        return []
    found = failed_calls(run)
    if found is None:
        return []
    pg, seq, calls = found
    if len(calls) < 2:
        return []
    odd = _odd_ones(calls)
    if odd is None:
        return []
    culprits, how = odd
    if how == "tie":
        return [_tie_finding(pg, seq, calls)]
    others = sorted(r for r in calls if r not in culprits)
    ref = next(
        (calls[r] for r in others if calls[r].callsite), calls[others[0]] if others else None
    )
    if ref is None:
        return []
    aborted = sorted(r for r, c in calls.items() if c.how == "aborted")
    who = f"rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))}"
    they = f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
    if how == "line":
        title = (
            f"Collective mismatch at {ref.op} seq {seq} (group {pg}): {they} called "
            f"{_describe(ref)}; {who} called "
            + "; ".join(_describe(calls[r]) for r in culprits)
            + " instead: it skipped that collective or is one ahead"
        )
    elif how == "size":
        title = (
            f"Collective size mismatch: {who} passed "
            + ", ".join(f"{calls[r].bytes} B" for r in culprits)
            + f" to {ref.op} where {they} passed {ref.bytes} B each (seq {seq}, group {pg}) "
            f"at {ref.callsite}"
        )
    else:
        title = (
            f"Collective size mismatch at {ref.op} seq {seq} (group {pg}) at {ref.callsite}: "
            f"{they} passed {ref.bytes} B each; {who} "
            f"{'were' if len(culprits) > 1 else 'was'} aborted by gloo inside it "
            "(received data size doesn't match), so its size differs"
        )
    if aborted and aborted != culprits:
        title += (
            f" (gloo aborted rank{'s' if len(aborted) > 1 else ''} "
            f"{', '.join(map(str, aborted))}: a consequence)"
        )
    culprit_site = next((calls[r].callsite for r in culprits if calls[r].callsite), None)
    return [
        Finding(
            kind="desync",
            severity="high",
            cost_ms_per_step=0.0,
            ranks=culprits,
            title=title,
            evidence={
                "pg_name": pg,
                "seq": seq,
                "op": ref.op,
                "culprit_ranks": culprits,
                "mismatch": how,
                "aborted_ranks": aborted,
                "calls": _evidence_calls(calls),
            },
            fix=FIX,
            location=_path_line(ref.callsite if how != "line" else culprit_site or ref.callsite),
        )
    ]
