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
        # a collective mismatch that names its culprit explains the ranks that died of it
        if f.kind == "desync" and isinstance(f.evidence, dict) and f.evidence.get("culprit_ranks"):
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
    standard library, not gpudiag), as "path:line"."""
    best = None
    for path, line in _FRAME_RE.findall(stack_text or ""):
        if any(p in path for p in ("site-packages", "/torch/", "/gpudiag/", "/lib/python", "<")):
            continue
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


def exposed_comm_findings(
    ranks: Any,
    step_ms: float,
    stall: Any = None,
    straggler_ms: float = 0.0,
    largest_bytes: float | None = None,
) -> list[Finding]:
    """Exposed communication net of the waiting for a straggler (``straggler_ms`` is the
    mean over ranks of that wait, see :func:`waiting_share`). When even the largest
    collective is tiny (``largest_bytes``), the advice is about latency, not bandwidth."""
    if ranks is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return []
    exposed = ranks["comm_exposed"].astype(float)
    cost = max(float(exposed.mean()) - straggler_ms, 0.0)
    severity = severity_for(cost, step_ms)
    if severity is None:
        return []
    steps = ranks["step_ms_mean"].astype(float)
    hit = [
        int(r) for r, e, s in zip(ranks["rank"], exposed, steps, strict=False) if severity_for(e, s)
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
            title=_exposed_title(float(exposed.mean()), straggler_ms, cost, step_ms),
            evidence={
                "comm_exposed_ms": ms(float(exposed.mean())),
                "waiting_for_straggler_ms": ms(straggler_ms),
                "comm_overlapped_ms": ms(overlapped),
                "overlap_fraction": round(overlapped / (overlapped + cost), 3)
                if overlapped + cost > 0
                else None,
                "step_ms": ms(step_ms),
                "allreduce_stall_ms_per_step": stall_ms,
                "per_rank_exposed_ms": {
                    str(int(r)): ms(e) for r, e in zip(ranks["rank"], exposed, strict=False)
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


def _exposed_title(gross: float, waiting: float, cost: float, step_ms: float) -> str:
    """The per-rank table's number (mean over ranks) first, then what is left of it once
    the wait for a straggler (costed by ``straggler``) is set apart."""
    share = f"{100 * cost / step_ms:.0f}% of the step"
    if waiting <= 0.05 * gross:
        return f"{cost:.1f} ms per step of communication is not overlapped with compute ({share})"
    return (
        f"{gross:.1f} ms per step of communication is not overlapped with compute (mean over "
        f"ranks); {waiting:.1f} ms of it is waiting for the straggler, the other {cost:.1f} ms "
        f"({share}) is the communication itself"
    )


def bucket_findings(
    buckets: Any,
    ranks: Any,
    step_ms: float,
    straggler_ms: float = 0.0,
    largest_bytes: float | None = None,
) -> list[Finding]:
    """Fires only when communication is exposed (beyond waiting for a straggler): bucket
    count/size is then the lever. Not for latency-bound jobs (every collective tiny): a
    model whose gradients fill a few hundred bytes has nothing to re-bucket."""
    if buckets is None or len(buckets) == 0 or ranks is None or len(ranks) == 0:
        return []
    if latency_bound(largest_bytes):
        return []
    exposed = max(float(ranks["comm_exposed"].astype(float).mean()) - straggler_ms, 0.0)
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
    return [
        Finding(
            kind="bucket_size",
            severity=severity_for(cost, step_ms) or "low",
            cost_ms_per_step=cost,
            ranks=[],
            title=f"DDP uses {why} gradient buckets ({count:.0f} per step) while {exposed:.1f} ms/step of communication is exposed",
            evidence={
                "buckets_per_step": round(count, 2),
                "mean_bucket_mb": None if math.isnan(mean_mb) else round(mean_mb, 3),
                "comm_exposed_ms": ms(exposed),
                "estimate": "half of the exposed communication",
            },
            fix=fix,
        )
    ]
