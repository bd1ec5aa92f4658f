"""Findings: what is wrong with a run, what it costs per step, and how to fix it.

A finding is data (kind, severity, cost, ranks, evidence, fix, location); the terminal
report, the JSON, the HTML and the dashboard only render it. Kind names are stable:
scripts and CI jobs key on them (see docs/findings.md).

Severity comes from the cost's share of the mean step time (:func:`severity_for`),
except for failures (``hang``, ``desync``, ``rank_failed``: always high) and
``dp_on_cpu`` (informational: low).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpudiag import frames
from gpudiag.rundir import LintDiagnostic, LintReport

KINDS = (
    "straggler",
    "exposed_communication",
    "dataloader_stall",
    "dataparallel_overhead",
    "gpu0_imbalance",
    "gpu_idle",
    "gpu_throttled",
    "host_sync",
    "bucket_size",
    "no_amp",
    "hang",
    "desync",
    "rank_failed",
    "dp_on_cpu",
)
SEVERITIES = ("high", "medium", "low")
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}

# Share of the mean step time a cost must reach for each severity.
HIGH_SHARE = 0.25
MEDIUM_SHARE = 0.10
LOW_SHARE = 0.02


@dataclass
class Finding:
    kind: str
    severity: str
    cost_ms_per_step: float
    ranks: list[int]
    title: str
    evidence: dict[str, Any]
    fix: str
    location: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # every finding is built here: a kind or severity outside the documented lists
        # (docs/findings.md) is a bug in gpudiag, not something to show a user
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r} (not in findings.KINDS)")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r} for a {self.kind} finding")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d["cost_ms_per_step"] = _finite(self.cost_ms_per_step)
        d["evidence"] = {k: _plain(v) for k, v in self.evidence.items()}
        d["ranks"] = [int(r) for r in self.ranks]
        return d


def severity_for(cost_ms: float, step_ms: float) -> str | None:
    """high / medium / low from the cost's share of the step, None when negligible."""
    if not (step_ms > 0) or not (cost_ms > 0):
        return None
    share = cost_ms / step_ms
    if share >= HIGH_SHARE:
        return "high"
    if share >= MEDIUM_SHARE:
        return "medium"
    if share >= LOW_SHARE:
        return "low"
    return None


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Failures first (a run that hung is the first thing to know), then most costly."""
    failure_kinds = {"rank_failed": 0, "hang": 1, "desync": 2}

    def failure_order(f: Finding) -> int:
        # the collective mismatch that broke the run (the calls each rank made) explains
        # the ranks that died of it, whether or not a majority names the culprit
        if f.kind == "desync" and isinstance(f.evidence, dict) and "mismatch" in f.evidence:
            return -1
        return failure_kinds.get(f.kind, 9)

    return sorted(
        findings,
        key=lambda f: (
            failure_order(f),
            -(f.cost_ms_per_step if math.isfinite(f.cost_ms_per_step) else 0.0),
            SEVERITY_RANK.get(f.severity, 3),
        ),
    )


def at_least(findings: list[Finding], severity: str) -> list[Finding]:
    limit = SEVERITY_RANK[severity]
    return [f for f in findings if SEVERITY_RANK.get(f.severity, 3) <= limit]


# --------------------------------------------------------------------------- lint.json
# The one join between `gpudiag lint` and `gpudiag analyze`: a lint rule's ``relates_to``
# names the finding kind that measures the same cost (gpudiag/lint/rules.py).

# Kinds whose cause is the code that a lint rule relating to another kind points at.
_RELATED_KINDS: dict[str, tuple[str, ...]] = {
    "dp_on_cpu": ("dataparallel_overhead",),
    "gpu0_imbalance": ("dataparallel_overhead",),
    "bucket_size": ("exposed_communication",),
}


def relates(diagnostic: LintDiagnostic, kind: str) -> bool:
    """Whether a lint diagnostic points at the code behind a finding of ``kind``."""
    return diagnostic.relates_to is not None and diagnostic.relates_to in {
        kind,
        *_RELATED_KINDS.get(kind, ()),
    }


def location_from_lint(kind: str, lint: LintReport | None) -> str | None:
    """Where the first lint diagnostic related to ``kind`` points, if any."""
    for diagnostic in lint.diagnostics if lint is not None else ():
        if relates(diagnostic, kind):
            return diagnostic.location
    return None


def measured_as(diagnostic: LintDiagnostic, findings: list[Finding]) -> Finding | None:
    """The runtime finding that measures a lint diagnostic's cost: of the kinds it relates
    to, the one located at the diagnostic, else the first (findings come sorted, costliest
    first)."""
    related = [f for f in findings if relates(diagnostic, f.kind)]
    here = [f for f in related if f.location == diagnostic.location]
    return (here or related)[0] if related else None


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


def user_frame(stack_text: str) -> str | None:
    """Innermost frame of a Python stack that is the user's code (not torch, not the
    standard library, not gpudiag, not an installed package: :mod:`gpudiag.frames`), as
    "path:line"."""
    best = None
    for path, line in _FRAME_RE.findall(stack_text or ""):
        if frames.is_user_file(path):
            best = f"{path}:{line}"
    return best


def attach_locations(findings: list[Finding], lint: LintReport | None) -> None:
    for f in findings:
        if f.location is None:
            f.location = location_from_lint(f.kind, lint)


# --------------------------------------------------------------------------- helpers


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _plain(value: Any) -> Any:
    """Numbers and containers as JSON-friendly plain Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    return str(value)


def ms(value: float) -> float:
    return round(float(value), 3)


# --------------------------------------------------------------------------- communication

STRAGGLER_FIX = (
    "Every other rank waits for this one at each collective. Compare its host (CPU "
    "load, other processes, throttled or older GPU, slower NIC/PCIe slot), its data "
    "shard (uneven batch sizes or sequence lengths) and any rank-specific work (logging, "
    "checkpointing, evaluation on rank 0 only inside the step)."
)
EXPOSED_COMM_FIX = (
    "Communication is not hidden behind compute: use a larger per-GPU batch or gradient "
    "accumulation with model.no_sync() on the non-final micro-steps, tune "
    "DDP(bucket_cap_mb=...) so the first buckets start early, gradient_as_bucket_view=True, "
    "bf16 gradients (DDP comm hook bf16_compress_hook) and, on multi-node jobs, a faster "
    "interconnect; for large models consider FSDP/ZeRO-style sharding."
)
EXPOSED_COMM_FIX_LATENCY = (
    "Every collective carries only a few bytes: the time is per-call latency, not "
    "bandwidth, so compressing or sharding gradients would not help. Communicate less "
    "often: accumulate gradients over several micro-batches with model.no_sync() on the "
    "non-final ones, or use a larger per-GPU batch; keep ranks that talk often on one host."
)
# Below this many bytes in its largest collective, a job's communication is latency-bound:
# at >= 1 GB/s, 64 KiB moves in <= 64 µs, the order of one gloo/NCCL call's latency.
LATENCY_BOUND_BYTES = 64 * 1024
BUCKET_FIX_FEW = (
    "Too few DDP buckets: the all-reduce starts only when most gradients are ready. "
    "Lower DDP(bucket_cap_mb=...) (default 25) so reductions overlap more of backward."
)
BUCKET_FIX_MANY = (
    "Many small DDP buckets: per-collective latency dominates. Raise "
    "DDP(bucket_cap_mb=...) (default 25) or flatten parameters."
)


# A medium or high straggler must be late in more steps than chance makes a rank late:
# the probability of being last in at least that many of the matched steps, when each
# step's last rank were drawn at random among the ranks, must not exceed this.
MAX_CHANCE_OF_LATENESS = 0.001


def _chance_of_lateness(named: Any, n_ranks: int) -> float | None:
    """The binomial tail P(X >= k), X ~ Bin(steps, 1 / n_ranks), for the named rank least
    often late (k = its late steps); None without the per-step columns."""
    if n_ranks < 2 or not {"steps", "last_share"} <= set(getattr(named, "columns", ())):
        return None
    worst = None
    for steps, share in zip(named["steps"], named["last_share"], strict=False):
        n, k = int(steps), round(float(share) * int(steps))
        if n <= 0:
            continue
        q = 1.0 / n_ranks
        tail = sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k, n + 1))
        worst = tail if worst is None else max(worst, tail)
    return worst


def straggler_findings(
    stragglers: Any,
    step_ms: float,
    contention: dict[str, Any] | None = None,
    rank_nodes: dict[int, int] | None = None,
    ended_early: bool = False,
) -> list[Finding]:
    """Ranks flagged by stragglers.py, costed net of the mutual waiting: what the others
    wait for a rank minus the most any other rank makes them wait (two ranks that take
    turns arriving last are jitter, not a straggler). Capped at low severity when fewer
    than stragglers.MIN_STEPS steps were matched, when other processes kept the host's
    CPUs saturated (``contention`` from host.host_contention): the rank may then be late
    because it got less CPU, not because of anything it does; or when the run failed or
    hung (``ended_early``): its failure is the finding, and the few steps before it say
    little about a rank's pace."""
    if stragglers is None or len(stragglers) == 0 or "is_straggler" not in stragglers:
        return []
    # The median over steps resists a few steps where one rank was descheduled (shared
    # hosts): a real straggler is late in most steps.
    column = "median_cost_ms" if "median_cost_ms" in stragglers else "cost_ms_per_step"
    cost = stragglers[column].astype(float).fillna(0).to_numpy()
    flagged = stragglers["is_straggler"].astype(bool).to_numpy()
    if not flagged.any() or (len(stragglers) > 1 and flagged.all()):
        return []
    best_other = max((c for c, f in zip(cost, flagged, strict=False) if not f), default=0.0)
    net = {
        int(r): float(c - best_other)
        for r, c, f in zip(stragglers["rank"], cost, flagged, strict=False)
        if f and severity_for(c - best_other, step_ms)
    }
    if not net:
        return []
    ranks = sorted(net)
    worst = max(net.values())
    all_skew = zip(stragglers["rank"], stragglers["mean_skew_ms"], strict=False)
    named = stragglers[stragglers["rank"].isin(ranks)]
    consistent = bool(named["consistent"].all()) if "consistent" in named else True
    severity = severity_for(worst, step_ms) or "low"
    if not consistent:  # too few steps to tell a straggler from a hiccup: say less
        severity = "low"
    chance = _chance_of_lateness(named, len(stragglers))
    if chance is not None and chance > MAX_CHANCE_OF_LATENESS:
        severity = "low"  # late that often by chance alone (e.g. 9 of 11 steps of 2 ranks)
    contended = bool(contention and contention.get("contended"))
    if contended:  # other processes held the CPUs: the scheduler may be the cause
        severity = "low"
    if ended_early:
        severity = "low"
    consistency: dict[str, Any] = {}
    if "last_share" in named:
        consistency = {
            "steps_matched": int(named["steps"].max()),
            "late_share_of_steps": {
                str(int(r)): round(float(v), 2)
                for r, v in zip(named["rank"], named["last_share"], strict=False)
            },
            "noise_floor_ms": {
                str(int(r)): ms(v) for r, v in zip(named["rank"], named["noise_ms"], strict=False)
            },
            "consistent": consistent,
            **({"chance_p": float(f"{chance:.2g}")} if chance is not None else {}),
        }
    # a multi-node job: say on which node each named rank runs
    nodes = rank_nodes if rank_nodes and len(set(rank_nodes.values())) > 1 else {}
    where = {r: f"{r} (node {nodes[r]})" if r in nodes else str(r) for r in ranks}
    return [
        Finding(
            kind="straggler",
            severity=severity,
            cost_ms_per_step=worst,
            ranks=ranks,
            title=(
                f"Rank{'s' if len(ranks) > 1 else ''} {', '.join(where[r] for r in ranks)} arrive"
                f"{'' if len(ranks) > 1 else 's'} last at collectives; the others wait "
                f"{worst:.1f} ms per step"
                + (
                    ""
                    if consistent
                    else f" (only {consistency.get('steps_matched', 0)} step(s) matched: "
                    "not shown to be consistent)"
                )
                + (
                    f" (late in {min(consistency.get('late_share_of_steps', {}).values(), default=0):.0%}"
                    f" of {consistency.get('steps_matched', 0)} matched steps, which chance alone"
                    f" gives with p = {chance:.2g}: not shown to be consistent)"
                    if consistent and chance is not None and chance > MAX_CHANCE_OF_LATENESS
                    else ""
                )
                + (
                    "; other processes kept the host's CPUs saturated, so it may just have "
                    "had less CPU time"
                    if contended
                    else ""
                )
            ),
            evidence={
                "net_wait_ms_per_step": {str(r): ms(v) for r, v in net.items()},
                "others_max_wait_caused_ms": ms(best_other),
                "cost_basis": column,
                "mean_cost_ms_per_step": {
                    str(int(r)): ms(c)
                    for r, c in zip(
                        stragglers["rank"], stragglers["cost_ms_per_step"], strict=False
                    )
                },
                "mean_skew_ms": {str(int(r)): ms(v) for r, v in all_skew},
                "last_arrivals": {
                    str(int(r)): int(n)
                    for r, n in zip(
                        stragglers["rank"], stragglers.get("last_count", []), strict=False
                    )
                },
                "step_ms": ms(step_ms),
                **({"nodes": {str(r): nodes[r] for r in ranks if r in nodes}} if nodes else {}),
                **consistency,
                **({"host_cpu": contention} if contention else {}),
            },
            fix=STRAGGLER_FIX,
        )
    ]


def waiting_share(ranks: Any, straggler_ranks: list[int], straggler_ms: float) -> float:
    """Mean over ranks of the time spent waiting for the straggler(s): every rank but
    the straggler(s) waits ``straggler_ms`` per step (it shows as exposed communication
    there, and is costed by ``straggler``)."""
    n = len(ranks) if ranks is not None else 0
    if not n or not straggler_ranks:
        return 0.0
    waiting = n - len(set(straggler_ranks) & set(int(r) for r in ranks["rank"]))
    return straggler_ms * waiting / n


def largest_collective_bytes(collectives: Any) -> float | None:
    """Bytes of the largest collective with a known size (None when no size is known)."""
    if collectives is None or len(collectives) == 0 or "bytes" not in collectives:
        return None
    sizes = collectives["bytes"].astype(float)
    sizes = sizes[sizes.notna() & (sizes > 0)]
    return float(sizes.max()) if len(sizes) else None


def latency_bound(largest_bytes: float | None) -> bool:
    return largest_bytes is not None and largest_bytes < LATENCY_BOUND_BYTES


def _by_rank(ranks: Any, table: Any, column: str, missing: float = 0.0) -> np.ndarray:
    """``table[column]`` aligned on the per-rank table's ranks (``missing`` where a rank
    has none)."""
    if table is None or len(table) == 0 or column not in table:
        return np.full(len(ranks), missing, dtype=float)
    values = dict(zip(table["rank"].astype(int), table[column].astype(float), strict=False))
    return np.array([values.get(int(r), missing) for r in ranks["rank"]], dtype=float)


@dataclass(frozen=True)
class ExposedSplit:
    """The per-rank table's exposed communication (mean over ranks, ms per step) split
    into the wait for late peers and the transfer (what better overlap gives back).
    ``unknown_ms``: the part of the transfer inside collectives that could not be matched
    across ranks, whose wait for peers is unknown (the transfer is then an upper bound)."""

    gross_ms: float
    waiting_ms: float
    unknown_ms: float

    @property
    def transfer_ms(self) -> float:
        return max(self.gross_ms - self.waiting_ms, 0.0)

    @property
    def known_transfer_ms(self) -> float:
        return max(self.transfer_ms - self.unknown_ms, 0.0)

    @property
    def upper_bound(self) -> bool:
        """Enough of the transfer is unknown to rate only the known part."""
        return self.unknown_ms > 0.05 * self.transfer_ms


def exposed_split(ranks: Any, peer_wait: Any, straggler_ms: float = 0.0) -> ExposedSplit:
    """Waiting = the measured exposed wait for the last peer to arrive at each collective
    (comms.peer_wait: arrival skew, a straggler's lead included), or the straggler's share
    (:func:`waiting_share`) when that is larger (it covers every step of the run, the
    measured wait only the traced ones). Overlap does not give it back: a straggler, load
    imbalance or a descheduled peer is its cause. A rank ``peer_wait`` does not cover (it
    could not be measured) counts as unknown: all of its exposed time."""
    if ranks is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return ExposedSplit(0.0, 0.0, 0.0)
    exposed = ranks["comm_exposed"].astype(float).to_numpy()
    gross = float(exposed.mean())
    measured = float(_by_rank(ranks, peer_wait, "peer_wait_ms").mean())
    waiting = min(max(measured, straggler_ms, 0.0), gross)
    # a rank without a measured wait (no trace of it, or the analysis failed): unknown
    seen = _by_rank(ranks, peer_wait, "comm_exposed_ms", missing=np.nan)
    unmatched = np.where(np.isnan(seen), exposed, _by_rank(ranks, peer_wait, "unmatched_ms"))
    unknown = float(unmatched.mean())
    return ExposedSplit(gross, waiting, min(max(unknown, 0.0), gross - waiting))


def exposed_comm_findings(
    ranks: Any,
    step_ms: float,
    stall: Any = None,
    straggler_ms: float = 0.0,
    largest_bytes: float | None = None,
    peer_wait: Any = None,
) -> list[Finding]:
    """Exposed communication net of the waiting for peers: the cost is the transfer part,
    what better overlap gives back. ``peer_wait`` (comms.peer_wait) gives each rank's
    exposed wait for the last peer to arrive at each collective, and the exposed time in
    collectives that could not be matched across ranks (their wait is unknown: the cost
    is then an upper bound, and the severity comes from the part known to be transfer,
    low at least). ``straggler_ms``: the mean over ranks of the wait for a named straggler
    (:func:`waiting_share`), set apart at least. When even the largest collective is tiny
    (``largest_bytes``), the advice is about latency, not bandwidth."""
    if ranks is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return []
    exposed = ranks["comm_exposed"].astype(float)
    split = exposed_split(ranks, peer_wait, straggler_ms)
    gross, waiting, unknown, cost = (
        split.gross_ms,
        split.waiting_ms,
        split.unknown_ms,
        split.transfer_ms,
    )
    severity = severity_for(cost, step_ms)
    if severity is None:
        return []
    if split.upper_bound:  # say less: rate only what is known to be transfer
        severity = severity_for(split.known_transfer_ms, step_ms) or "low"
    per_rank_wait = _by_rank(ranks, peer_wait, "peer_wait_ms")
    steps = ranks["step_ms_mean"].astype(float)
    hit = [
        int(r)
        for r, e, w, s in zip(ranks["rank"], exposed, per_rank_wait, steps, strict=False)
        if severity_for(e - w, s)
    ]
    overlapped = float(ranks["comm_overlapped"].astype(float).mean())
    stall_ms = None
    if stall is not None and len(stall) and "stall_ms" in stall:
        stall_ms = ms(float(stall["stall_ms"].astype(float).mean()))
    return [
        Finding(
            kind="exposed_communication",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=hit,
            title=_exposed_title(split, step_ms, straggler_ms > 0),
            evidence={
                "comm_exposed_ms": ms(gross),
                "waiting_for_peers_ms": ms(waiting),
                "waiting_for_straggler_ms": ms(straggler_ms),
                "transfer_ms": ms(cost),
                **(
                    {"unmatched_ms": ms(unknown), "cost_is_upper_bound": True}
                    if unknown > 0
                    else {}
                ),
                "comm_overlapped_ms": ms(overlapped),
                "overlap_fraction": round(overlapped / (overlapped + cost), 3)
                if overlapped + cost > 0
                else None,
                "step_ms": ms(step_ms),
                "allreduce_stall_ms_per_step": stall_ms,
                "per_rank_exposed_ms": {
                    str(int(r)): ms(e) for r, e in zip(ranks["rank"], exposed, strict=False)
                },
                "per_rank_waiting_for_peers_ms": {
                    str(int(r)): ms(w) for r, w in zip(ranks["rank"], per_rank_wait, strict=False)
                },
                **(
                    {"latency_bound": True, "largest_collective_bytes": largest_bytes}
                    if latency_bound(largest_bytes)
                    else {}
                ),
            },
            fix=EXPOSED_COMM_FIX_LATENCY if latency_bound(largest_bytes) else EXPOSED_COMM_FIX,
        )
    ]


def _exposed_title(split: ExposedSplit, step_ms: float, straggler: bool = False) -> str:
    """The per-rank table's number (mean over ranks) first, then what is left of it once
    the wait for peers to arrive (a straggler's included, costed by ``straggler``) is set
    apart; an upper bound when some collectives could not be matched across ranks."""
    cost = split.transfer_ms
    share = f"{100 * cost / step_ms:.0f}% of the step"
    bound = (
        f", an upper bound on the transfer: {split.unknown_ms:.1f} ms of it is in collectives "
        "not matched across ranks (not every rank traced), whose wait for late peers is unknown"
        if split.upper_bound
        else ""
    )
    if split.waiting_ms <= 0.05 * split.gross_ms:
        return (
            f"{cost:.1f} ms per step of communication is not overlapped with compute "
            f"({share}){bound}"
        )
    whom = " (the straggler among them)" if straggler else ""
    return (
        f"{split.gross_ms:.1f} ms per step of communication is not overlapped with compute "
        f"(mean over ranks); {split.waiting_ms:.1f} ms of it is waiting for late peers to "
        f"arrive at collectives{whom}, the other {cost:.1f} ms ({share}) is the transfer "
        f"itself{bound}"
    )


def bucket_findings(
    buckets: Any,
    ranks: Any,
    step_ms: float,
    split: ExposedSplit | None = None,
    largest_bytes: float | None = None,
) -> list[Finding]:
    """Fires only when communication is exposed beyond waiting for peers (``split``,
    :func:`exposed_split`; rated on the part known to be transfer): bucket
    count/size is then the lever. Not for latency-bound jobs (every collective tiny): a
    model whose gradients fill a few hundred bytes has nothing to re-bucket."""
    if buckets is None or len(buckets) == 0 or ranks is None or len(ranks) == 0:
        return []
    if latency_bound(largest_bytes):
        return []
    split = split or exposed_split(ranks, None)
    exposed = split.transfer_ms
    if severity_for(exposed, step_ms) is None:
        return []
    size_col = next((c for c in ("bytes", "size_bytes", "bucket_bytes") if c in buckets), None)
    per_step = buckets
    if "rank" in buckets:
        per_step = buckets[buckets["rank"] == buckets["rank"].min()]
    n_steps = per_step["step"].nunique() if "step" in per_step and per_step["step"].nunique() else 1
    count = len(per_step) / max(n_steps, 1)
    mean_mb = float(per_step[size_col].astype(float).mean() / 2**20) if size_col else float("nan")
    if count <= 2:
        fix, why = BUCKET_FIX_FEW, "few"
    elif count >= 40 and (math.isnan(mean_mb) or mean_mb < 2):
        fix, why = BUCKET_FIX_MANY, "many small"
    else:
        return []
    # The part a better bucketing can recover: at most the exposed communication.
    cost = exposed / 2
    known = split.known_transfer_ms / 2 if split.upper_bound else cost
    return [
        Finding(
            kind="bucket_size",
            severity=severity_for(known, step_ms) or "low",
            cost_ms_per_step=cost,
            ranks=[],
            title=f"DDP uses {why} gradient buckets ({count:.0f} per step) while {exposed:.1f} ms/step of communication transfer is exposed",
            evidence={
                "buckets_per_step": round(count, 2),
                "mean_bucket_mb": None if math.isnan(mean_mb) else round(mean_mb, 3),
                "comm_exposed_ms": ms(exposed),
                "estimate": "half of the exposed communication",
            },
            fix=fix,
        )
    ]
