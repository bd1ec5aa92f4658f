"""Findings: what is wrong with a run, what it costs per step, and how to fix it.

A finding is data (kind, severity, cost, ranks, evidence, fix, location); the terminal
report, the JSON, the HTML and the dashboard only render it. Kind names are stable:
scripts and CI jobs key on them (see docs/findings.md).

Severity comes from the cost's share of the run's steady step time (:func:`severity_for`,
analysis/steady.py), except for failures (``hang``, ``desync``, ``rank_failed``: always high) and
``dp_on_cpu`` (informational: low).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpudiag import frames
from gpudiag.analysis.gradient_sync import GradientSyncRounds
from gpudiag.numfmt import ms_text, pct_text

if TYPE_CHECKING:  # annotations only: the analysis does not load the linter
    from gpudiag.lint.report import LintDiagnostic, LintReport

KINDS = (
    "straggler",
    "exposed_communication",
    "sync_point",
    "dataloader_stall",
    "dataloader_startup",
    "startup_wait",
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

# Share of the steady step time a cost must reach for each severity.
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


# Fewer steps than this are one or two samples, the first of them start-up: no cost per
# step measured on them is sure enough for more than a low finding.
FEW_STEPS = 3
# what a run's state shows, whatever its length
STATE_KINDS = frozenset(("rank_failed", "hang", "desync"))


def hedge_few_steps(findings: list[Finding], steps: int) -> None:
    """Cap every cost finding of a gpudiag run with fewer than FEW_STEPS steps at low,
    and say why (a run interrupted at step 1 got a medium dataloader_stall from its first
    batch's 0.45 ms). Not for foreign traces: one "step" of a trace without ProfilerStep
    marks is its whole span, not one sample."""
    if steps >= FEW_STEPS:
        return
    for f in findings:
        if f.kind in STATE_KINDS:
            continue
        f.severity = "low"
        f.title += f" (from only {steps} step{'s' * (steps != 1)}: too few to be sure)"
        f.evidence["steps measured"] = steps


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Failures first (a run that hung is the first thing to know), then by severity
    (high, medium, low), then most costly first, a finding's cause (evidence
    ``caused_by``) just above it: the order of every view."""
    failure_kinds = {"rank_failed": 0, "hang": 1, "desync": 2}

    def failure_order(f: Finding) -> int:
        # the collective mismatch that broke the run (the calls each rank made) explains
        # the ranks that died of it, whether or not a majority names the culprit
        if f.kind == "desync" and isinstance(f.evidence, dict) and "mismatch" in f.evidence:
            return -1
        return failure_kinds.get(f.kind, 9)

    def own_key(f: Finding) -> tuple[float, ...]:
        raw = f.cost_ms_per_step
        cost = float(raw) if isinstance(raw, (int, float)) and math.isfinite(raw) else 0.0
        return (failure_order(f), SEVERITY_RANK.get(f.severity, 3), -cost, 0)

    keys = {id(f): own_key(f) for f in findings}
    # a cause goes just above what it causes (a data wait above the straggler it makes,
    # which costs a little more: the first finding read was "straggler"; probe 29i)
    by_kind = {f.kind: f for f in findings}
    for f in findings:
        caused_by = f.evidence.get("caused_by") if isinstance(f.evidence, dict) else None
        cause = by_kind.get(caused_by) if isinstance(caused_by, str) else None
        if cause is not None and cause is not f and keys[id(f)] < keys[id(cause)]:
            keys[id(cause)] = (*keys[id(f)][:3], -1)
    return sorted(findings, key=lambda f: keys[id(f)])


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


user_frame = frames.user_frame  # where failures.py and the tests take it from


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
        if not math.isfinite(value):
            return None
        # a small number (a p-value: 3.7e-09) keeps its two significant digits; 4
        # decimals made it 0.0, which says "impossible" (browser probe of issue 31)
        return round(value, 4) if abs(value) >= 1e-3 or value == 0 else float(f"{value:.2g}")
    if isinstance(value, int):
        return value
    return str(value)


def ms(value: float) -> float:
    return round(float(value), 3)


# --------------------------------------------------------------------------- communication

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
# The same advice where nothing shows DDP (RunInfo.ddp_evidence is None): the all-reduces
# are not DDP's gradient buckets (Megatron's tensor-parallel layers', a framework's own),
# so DDP's knobs (bucket_cap_mb, no_sync, its comm hooks) do not apply (issue 31, D).
EXPOSED_COMM_FIX_NOT_DDP = (
    "Communication is not hidden behind compute. Nothing in the traces shows DDP, so these "
    "all-reduce calls are not DDP's gradient buckets (a tensor-parallel layer's all-reduce, "
    "in Megatron-style models, sits between its GEMMs and waits for them): overlap them with "
    "compute where the framework can (Megatron-LM: --sequence-parallel with "
    "--tp-comm-overlap), keep each tensor-parallel group inside one node's NVLink domain, "
    "use a smaller tensor-parallel size (more pipeline or data parallelism instead) or a "
    "larger micro-batch so each call carries more work; on multi-node jobs, a faster "
    "interconnect."
)
EXPOSED_COMM_FIX_LATENCY_NOT_DDP = (
    "Every collective carries only a few bytes: the time is per-call latency, not "
    "bandwidth, so compressing or sharding the data would not help. Make fewer, larger "
    "calls (reduce tensors together, a larger micro-batch) and keep ranks that talk often "
    "on one host."
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


# Kinds measured across ranks: a rank missing from the run makes them unsure.
_CROSS_RANK_KINDS = ("straggler", "exposed_communication", "bucket_size")


def note_untraced_ranks(
    findings: list[Finding], missing: list[int], world_size: int, total_missing: int
) -> None:
    """A run that recorded fewer ranks than its world (a launcher gpudiag did not follow, a
    node's directory not given): the communication findings cannot tell waiting for an
    unrecorded peer from transfer, and a straggler may be one of the missing ranks. Each
    such finding says so in its title, is an upper bound, and is capped at low."""
    if not missing:
        return
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    count = f"{total_missing} ranks: " if total_missing > 8 else ""
    for f in findings:
        if f.kind not in _CROSS_RANK_KINDS:
            continue
        f.title += (
            f" (an upper bound: {count}rank{'s' if total_missing > 1 else ''} {shown} of the world of "
            f"{world_size} {'were' if total_missing > 1 else 'was'} not recorded, and waiting "
            "for them cannot be told from the rest)"
        )
        f.evidence["cost_is_upper_bound"] = True
        f.evidence["unrecorded_ranks"] = list(missing[:64])
        f.severity = "low"


def straggler_waits(ranks: Any, stragglers: Iterable[Finding]) -> dict[int, float]:
    """Each rank's wait for the named straggler(s), ms per steady step: every rank but a
    straggler waits its cost (:func:`waiting_share` is the mean of this over ranks)."""
    if ranks is None or len(ranks) == 0:
        return {}
    waits = {int(r): 0.0 for r in ranks["rank"]}
    for f in stragglers:
        named = {int(r) for r in f.ranks}
        for r in waits:
            if r not in named:
                waits[r] += float(f.cost_ms_per_step)
    return waits


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
    # each rank's part of ``waiting_ms`` (their mean), in the per-rank table's order
    per_rank_waiting_ms: tuple[float, ...] = ()
    # the part of ``waiting_ms`` inside small synchronisation calls after the last rank
    # arrived (sync_points.py: their latency, not gradient transfer; costed by sync_point)
    sync_ms: float = 0.0

    @property
    def transfer_ms(self) -> float:
        return max(self.gross_ms - self.waiting_ms, 0.0)

    @property
    def known_transfer_ms(self) -> float:
        return max(self.transfer_ms - self.unknown_ms, 0.0)

    def scaled(self, factor: float) -> ExposedSplit:
        """Every part times ``factor`` (the profiled window's step to the steady step)."""
        return ExposedSplit(
            self.gross_ms * factor,
            self.waiting_ms * factor,
            self.unknown_ms * factor,
            tuple(w * factor for w in self.per_rank_waiting_ms),
            self.sync_ms * factor,
        )

    @property
    def peers_ms(self) -> float:
        """The wait for late peers alone (``waiting_ms`` less the sync points' latency)."""
        return max(self.waiting_ms - self.sync_ms, 0.0)

    @property
    def upper_bound(self) -> bool:
        """Enough of the transfer is unknown to rate only the known part."""
        return self.unknown_ms > 0.05 * self.transfer_ms


def measured_wait_ranks(ranks: Any, peer_wait: Any) -> list[bool]:
    """Per rank of the per-rank table: its wait for peers was measured, every one of its
    collectives matched across ranks (comms.peer_wait)."""
    seen = _by_rank(ranks, peer_wait, "comm_exposed_ms", missing=np.nan)
    unmatched = _by_rank(ranks, peer_wait, "unmatched_ms")
    return [bool(not np.isnan(s) and u <= 0) for s, u in zip(seen, unmatched, strict=True)]


def exposed_split(
    ranks: Any,
    peer_wait: Any,
    straggler_wait: Mapping[int, float] | float = 0.0,
    sync_latency: Mapping[int, float] | None = None,
) -> ExposedSplit:
    """Waiting = the measured exposed wait for the last peer to arrive at each collective
    (comms.peer_wait: arrival skew, a straggler's lead included), or, per rank, its wait
    for a named straggler (``straggler_wait``: :func:`straggler_waits` in the window's
    terms; a number is every rank's) when that is larger (it covers every step of the
    run, the measured wait only the traced ones), at most the rank's exposed time; the
    split's waiting is the mean of the ranks' (so a chart of the per-rank parts adds up
    to the finding's numbers). Overlap does not give it back: a straggler, load
    imbalance or a descheduled peer is its cause. A rank ``peer_wait`` does not cover (it
    could not be measured) counts as unknown: all of its exposed time. ``sync_latency``
    (sync_points.SyncPoints.per_rank_latency_ms): each rank's exposed time in small
    synchronisation calls after the last rank arrived, set apart too (``sync_ms``)."""
    if ranks is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return ExposedSplit(0.0, 0.0, 0.0)
    exposed = ranks["comm_exposed"].astype(float).to_numpy()
    gross = float(exposed.mean())
    measured = _by_rank(ranks, peer_wait, "peer_wait_ms")
    if isinstance(straggler_wait, Mapping):
        owed = np.array([straggler_wait.get(int(r), 0.0) for r in ranks["rank"]], dtype=float)
    else:
        owed = np.full(len(exposed), float(straggler_wait))
    peers = np.minimum(np.maximum(np.maximum(measured, owed), 0.0), np.maximum(exposed, 0.0))
    latency = np.array([(sync_latency or {}).get(int(r), 0.0) for r in ranks["rank"]], dtype=float)
    per_rank = np.minimum(peers + np.maximum(latency, 0.0), np.maximum(exposed, 0.0))
    waiting = min(float(per_rank.mean()), gross)
    # a rank without a measured wait (no trace of it, or the analysis failed): unknown
    seen = _by_rank(ranks, peer_wait, "comm_exposed_ms", missing=np.nan)
    unmatched = np.where(np.isnan(seen), exposed, _by_rank(ranks, peer_wait, "unmatched_ms"))
    unknown = float(unmatched.mean())
    return ExposedSplit(
        gross,
        waiting,
        min(max(unknown, 0.0), gross - waiting),
        tuple(float(w) for w in per_rank),
        float((per_rank - peers).mean()),
    )


def _per_rank_exposed_evidence(
    ranks: Any, exposed: Any, per_rank_wait: tuple[float, ...]
) -> dict[str, dict[str, float]]:
    return {
        "per_rank_exposed_ms": {
            str(int(r)): ms(e) for r, e in zip(ranks["rank"], exposed, strict=False)
        },
        "per_rank_waiting_for_peers_ms": {
            str(int(r)): ms(w) for r, w in zip(ranks["rank"], per_rank_wait, strict=False)
        },
    }


def _straggler_part(ranks: Any, owed: Mapping[int, float] | float) -> float:
    """Mean over ranks of each rank's wait for a named straggler, at most its exposed
    communication (the profiled window's terms, as ``owed``)."""
    exposed = ranks["comm_exposed"].astype(float).to_numpy()
    if isinstance(owed, Mapping):
        waits = np.array([owed.get(int(r), 0.0) for r in ranks["rank"]], dtype=float)
    else:
        waits = np.full(len(exposed), float(owed))
    return float(np.minimum(np.maximum(waits, 0.0), np.maximum(exposed, 0.0)).mean())


def _owed_in_window(
    straggler_wait: Mapping[int, float] | None, straggler_ms: float, scale: float
) -> Mapping[int, float] | float:
    """The wait for a named straggler in the profiled window's terms: per rank where
    known, else the mean over ranks."""
    if straggler_wait:
        return {r: w / scale for r, w in straggler_wait.items()}
    return straggler_ms / scale


def exposed_comm_findings(
    ranks: Any,
    step_ms: float,
    stall: Any = None,
    straggler_ms: float = 0.0,
    largest_bytes: float | None = None,
    peer_wait: Any = None,
    runq_share: float | None = None,
    window_step_ms: float | None = None,
    sync_rounds: GradientSyncRounds | None = None,
    straggler_wait: Mapping[int, float] | None = None,
    ddp: bool = True,
    gloo_on_gpu: bool = False,
    sync_latency: Mapping[int, float] | None = None,
    sync_exposed_ms: float = 0.0,
) -> list[Finding]:
    """Exposed communication net of the waiting for peers: the cost is the transfer part,
    what better overlap gives back. ``peer_wait`` (comms.peer_wait) gives each rank's
    exposed wait for the last peer to arrive at each collective, and the exposed time in
    collectives that could not be matched across ranks (their wait is unknown: the cost
    is then an upper bound, and the severity comes from the part known to be transfer,
    low at least). ``straggler_ms``: the mean over ranks of the wait for a named straggler
    (:func:`waiting_share`), set apart at least (per rank where ``straggler_wait``,
    :func:`straggler_waits`, gives each rank's). When even the largest collective is tiny
    (``largest_bytes``), the advice is about latency, not bandwidth. ``runq_share``
    (steady.runq_share): the share of the step the ranks' training threads waited for a
    CPU; the transfer's time then includes the host's load, and the severity is rated on
    the part that is not (:func:`severity_under_load`); from :data:`STARVED_RUNQ_SHARE`
    on the title says so. ``window_step_ms``: the profiled window's mean step, where the steady step
    (``step_ms``) is shorter (the profiler slowed the steps it recorded): the window's
    times are scaled to the steady step (:func:`window_scale`) and the title says so.
    ``sync_rounds`` (gradient_sync.gradient_sync_rounds): DDP all-reduced the gradients
    more than once per optimizer step; the finding then says so, and its cost is what
    no_sync() on the non-final micro-steps gives back (:func:`_microstep_sync_finding`).
    ``ddp``: the run shows DDP (RunInfo.ddp_evidence); without it the fix names no DDP
    knob (:data:`EXPOSED_COMM_FIX_NOT_DDP`); ``gloo_on_gpu``: it names NCCL first. ``sync_latency``,
    ``sync_exposed_ms``: small sync calls (sync_points.py), set apart as the wait is."""
    if ranks is None or len(ranks) == 0 or "comm_exposed" not in ranks:
        return []
    exposed = ranks["comm_exposed"].astype(float)
    scale = window_scale(step_ms, window_step_ms)
    owed = _owed_in_window(straggler_wait, straggler_ms, scale)
    window = exposed_split(ranks, peer_wait, owed, sync_latency)
    split = window.scaled(scale)
    if sync_rounds is not None and sync_rounds.rounds_per_step >= 2:
        found = _microstep_sync_finding(
            sync_rounds, split, step_ms, runq_share, min(sync_exposed_ms * scale, split.gross_ms)
        )
        return [found] if found is not None else []
    gross, unknown, cost = split.gross_ms, split.unknown_ms, split.transfer_ms
    if severity_for(cost, step_ms) is None:
        return []
    # say less: rate only what is known to be transfer, and not the host's load
    rated = split.known_transfer_ms if split.upper_bound else cost
    severity = severity_under_load(rated, step_ms, runq_share)
    starved = host_starved(runq_share)
    # the profiled window's, as the per-rank table (and the chart drawn from it) is
    per_rank_wait = window.per_rank_waiting_ms
    hit = _ranks_exposed(ranks, exposed, per_rank_wait)
    overlapped = float(ranks["comm_overlapped"].astype(float).mean())
    stall_ms = _mean_stall_ms(stall)
    return [
        Finding(
            kind="exposed_communication",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=hit,
            title=_exposed_title(split, step_ms, straggler_ms > 0)
            + (_scaled_words(window, window_step_ms) if scale < 1 else "")
            + (STARVED_HOST_WORDS.format(share=runq_share) if starved else ""),
            evidence={
                "comm_exposed_ms": ms(gross),
                "waiting_for_peers_ms": ms(split.peers_ms),
                **({"sync_points_ms": ms(split.sync_ms)} if split.sync_ms > 0 else {}),
                # in the same terms as the rest: the part of each rank's exposed time
                # set apart for the straggler (a part, never more than the whole)
                "waiting_for_straggler_ms": ms(_straggler_part(ranks, owed) * scale),
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
                **_window_evidence(window, window_step_ms, scale, runq_share),
                "allreduce_stall_ms_per_step": stall_ms,
                **_per_rank_exposed_evidence(ranks, exposed, per_rank_wait),
                **(
                    {"latency_bound": True, "largest_collective_bytes": largest_bytes}
                    if latency_bound(largest_bytes)
                    else {}
                ),
            },
            fix=_exposed_fix(latency_bound(largest_bytes), ddp, gloo_on_gpu),
        )
    ]


GLOO_ON_GPU_FIX = (
    "The collectives run on gloo with the tensors on the GPU: gloo copies each one to host "
    "memory, reduces it on the CPU and copies it back, while the GPU waits. Use NCCL for "
    "CUDA tensors: dist.init_process_group('nccl') (or backend='cpu:gloo,cuda:nccl' where "
    "CPU tensors are reduced too); it reduces on the GPU, overlapped with the backward. "
)


def _exposed_fix(latency: bool, ddp: bool, gloo_on_gpu: bool = False) -> str:
    if latency:
        fix = EXPOSED_COMM_FIX_LATENCY if ddp else EXPOSED_COMM_FIX_LATENCY_NOT_DDP
    else:
        fix = EXPOSED_COMM_FIX if ddp else EXPOSED_COMM_FIX_NOT_DDP
    return GLOO_ON_GPU_FIX + "Then: " + fix if gloo_on_gpu else fix


NO_SYNC_FIX = (
    "Accumulate gradients without syncing them: run the forward and the backward of "
    "every micro-batch but the last under `with model.no_sync():` (the forward too: DDP "
    "decides in its forward whether the backward syncs, so a no_sync() around backward "
    "alone still all-reduces; accelerate: `with "
    "accelerator.accumulate(model):` and Accelerator(gradient_accumulation_steps=K); "
    "Lightning's accumulate_grad_batches and the HF Trainer's gradient_accumulation_steps "
    "do it for you). If the extra backward passes are not accumulation (SAM, two losses "
    "whose gradients must each be synced), the rounds are needed."
)


def _microstep_sync_finding(
    rounds: GradientSyncRounds,
    split: ExposedSplit,
    step_ms: float,
    runq_share: float | None,
    sync_exposed_ms: float = 0.0,
) -> Finding | None:
    """DDP all-reduced every bucket K times per optimizer step: the first K-1 rounds are
    summed over by the next backward. no_sync() on those micro-steps removes their
    exposed communication, waits for peers included: (K-1)/K of it. The rounds are
    counted, not timed, so a busy host does not make them doubtful (only the cost
    carries the host's load, and the title says so). Small synchronisation calls
    (``sync_exposed_ms``: a framework's flag broadcast, a logged metric's all_reduce) are
    not gradient rounds: no_sync() leaves them, and they are left out."""
    k = rounds.rounds_per_step
    gradient = max(split.gross_ms - sync_exposed_ms, 0.0)
    cost = gradient * (k - 1) / k
    severity = severity_for(cost, step_ms)
    if severity is None:
        return None
    calls = k * rounds.buckets
    title = (
        f"DDP all-reduced the gradients {k} times per optimizer step ({calls} bucket "
        f"all-reduces of {rounds.buckets} bucket{'s' * (rounds.buckets != 1)}, counted over "
        f"{rounds.steps} steps): gradient accumulation without no_sync()? The first {k - 1} "
        f"rounds are summed over by the next backward; skipping them gives back at least "
        f"{ms_text(cost)} ms per step ({k - 1}/{k} of the {ms_text(gradient)} ms of exposed "
        f"{'gradient ' if sync_exposed_ms > 0 else ''}communication, {pct_text(100 * cost / step_ms)} of the step; more where copying the gradients "
        "into the buckets and, on a CPU host, the all-reduces' threads slow the backward too)"
    )
    if host_starved(runq_share):
        title += STARVED_HOST_WORDS.format(share=runq_share)
    return Finding(
        kind="exposed_communication",
        severity=severity,
        cost_ms_per_step=cost,
        ranks=list(rounds.ranks),
        title=title,
        evidence={
            "gradient_sync_rounds_per_step": k,
            "ddp_buckets": rounds.buckets,
            "steps_counted": rounds.steps,
            "comm_exposed_ms": ms(split.gross_ms),
            "waiting_for_peers_ms": ms(split.waiting_ms),
            **({"sync_points_ms": ms(sync_exposed_ms)} if sync_exposed_ms > 0 else {}),
            "no_sync_gives_back_ms": ms(cost),
            # a floor: on 2-rank CPU jobs the measured gain was 1.6-3.2x (probe 29h)
            "cost_is_lower_bound": True,
            "step_ms": ms(step_ms),
        },
        fix=NO_SYNC_FIX,
    )


def _ranks_exposed(ranks: Any, exposed: Any, per_rank_wait: Any) -> list[int]:
    """The ranks whose own exposed transfer (exposed less their wait) is a finding."""
    steps = ranks["step_ms_mean"].astype(float)
    return [
        int(r)
        for r, e, w, s in zip(ranks["rank"], exposed, per_rank_wait, steps, strict=False)
        if severity_for(e - w, s)
    ]


def _mean_stall_ms(stall: Any) -> float | None:
    if stall is not None and len(stall) and "stall_ms" in stall:
        return ms(float(stall["stall_ms"].astype(float).mean()))
    return None


def window_scale(step_ms: float, window_step_ms: float | None) -> float:
    """steady step / profiled window's step, when the window's steps were longer (the
    profiler slows the steps it records): times measured in the window, times this, are
    per steady step. 1 otherwise."""
    if window_step_ms is None or not (window_step_ms > step_ms > 0):
        return 1.0
    return step_ms / window_step_ms


def _window_evidence(
    window: ExposedSplit, window_step_ms: float | None, scale: float, runq_share: float | None
) -> dict[str, Any]:
    """The profiled window's own numbers where they were scaled, and the run queue."""
    out: dict[str, Any] = {}
    if scale < 1:
        out["window_step_ms"] = ms(window_step_ms or 0.0)
        out["window_transfer_ms"] = ms(window.transfer_ms)
        out["window_scale"] = round(scale, 4)
    if runq_share is not None:
        out["runq_share_of_step"] = round(runq_share, 3)
        # the part of the cost the severity leaves to the host's load
        out["host_load_weight"] = round(host_load_weight(runq_share), 3)
    return out


def _scaled_words(window: ExposedSplit, window_step_ms: float | None) -> str:
    return (
        f" (measured in the profiled steps, which took {ms_text(window_step_ms or 0)} ms: "
        f"{ms_text(window.gross_ms)} ms exposed, {ms_text(window.transfer_ms)} ms transfer; scaled "
        "to the steady step)"
    )


# The job's training threads waited at least this share of the step for a CPU: the host
# was starving the job, and the finding's title says so. Only words: the severity follows
# host_load_weight, continuously.
STARVED_RUNQ_SHARE = 0.10
# How much of a cost measured on a loaded host is the host's load, from the share of the
# step the ranks' training threads waited for a CPU (steady.runq_share): none of it at
# HOST_LOAD_FLOOR, all of it from HOST_LOAD_FULL on, in proportion between. A ramp, not a
# threshold: the same healthy job measured at 8 %, 16 % and 7 % had been rated high, low,
# high as the share crossed a 10 % cap (probe 29h); now a small change in the share is a
# small change in the rated cost. The waits of the job's own threads and workers count
# too: the communication and loader threads are short of CPU either way.
HOST_LOAD_FLOOR = 0.0
HOST_LOAD_FULL = 0.15
STARVED_HOST_WORDS = (
    "; the ranks waited {share:.0%} of the step for a CPU (other processes held the "
    "host's cores), so part of this is the host's load, not the communication"
)


def host_starved(runq_share: float | None) -> bool:
    return runq_share is not None and runq_share >= STARVED_RUNQ_SHARE


def host_load_weight(runq_share: float | None) -> float:
    """The part (0 to 1) of a cost measured at this CPU-wait share that is put down to the
    host's load (:data:`HOST_LOAD_FLOOR`, :data:`HOST_LOAD_FULL`)."""
    if runq_share is None or not math.isfinite(runq_share):
        return 0.0
    ramp = (runq_share - HOST_LOAD_FLOOR) / (HOST_LOAD_FULL - HOST_LOAD_FLOOR)
    return min(max(ramp, 0.0), 1.0)


def severity_under_load(cost_ms: float, step_ms: float, runq_share: float | None) -> str:
    """The severity of a cost already found (severity_for gave one), rated on the part of
    it that is not the host's load (:func:`host_load_weight`); low at least."""
    rated = cost_ms * (1.0 - host_load_weight(runq_share))
    return severity_for(rated, step_ms) or "low"


def _exposed_title(split: ExposedSplit, step_ms: float, straggler: bool = False) -> str:
    """The per-rank table's number (mean over ranks) first, then what is left of it once
    the wait for peers to arrive (a straggler's included, costed by ``straggler``) is set
    apart; an upper bound when some collectives could not be matched across ranks."""
    cost = split.transfer_ms
    share = f"{pct_text(100 * cost / step_ms)} of the step"
    bound = (
        f", an upper bound on the transfer: {ms_text(split.unknown_ms)} ms of it is in collectives "
        "not matched across ranks (not every rank traced), whose wait for late peers is unknown"
        if split.upper_bound
        else ""
    )
    if split.waiting_ms <= 0.05 * split.gross_ms:
        return (
            f"{ms_text(cost)} ms per step of communication is not overlapped with compute "
            f"({share}){bound}"
        )
    whom = " (the straggler among them)" if straggler else ""
    sync = (
        f" or inside small synchronisation calls ({ms_text(split.sync_ms)} ms after the last "
        "rank arrived in them: a flag or a metric, not gradient transfer)"
        if split.sync_ms > 0
        else ""
    )
    return (
        f"{ms_text(split.gross_ms)} ms per step of communication is not overlapped with compute "
        f"(mean over ranks); {ms_text(split.waiting_ms)} ms of it is waiting for late peers to "
        f"arrive at collectives{whom}{sync}, the other {ms_text(cost)} ms ({share}) is the "
        f"transfer itself{bound}"
    )


# one parameter holds at least this share of the gradient: fewer buckets are its doing
UNSPLITTABLE_SHARE = 0.5


def bucket_findings(
    buckets: Any,
    ranks: Any,
    step_ms: float,
    split: ExposedSplit | None = None,
    largest_bytes: float | None = None,
    runq_share: float | None = None,
    unsplittable: float | None = None,
) -> list[Finding]:
    """Fires only when communication is exposed beyond waiting for peers (``split``,
    :func:`exposed_split`; rated on the part known to be transfer): bucket
    count/size is then the lever. Not for latency-bound jobs (every collective tiny): a
    model whose gradients fill a few hundred bytes has nothing to re-bucket. Not "few
    buckets" when one parameter holds half the gradient or more (``unsplittable``,
    gradient_sync.unsplittable_share): no bucket_cap_mb splits it."""
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
        if unsplittable is not None and unsplittable >= UNSPLITTABLE_SHARE:
            return []
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
            severity=severity_under_load(known, step_ms, runq_share),
            cost_ms_per_step=cost,
            ranks=[],
            title=f"DDP uses {why} gradient buckets ({count:.0f} per step) while {ms_text(exposed)} ms/step of communication transfer is exposed",
            evidence={
                "buckets_per_step": round(count, 2),
                # MiB (2**20 bytes), as the collectives table's sizes
                "mean_bucket_mib": None if math.isnan(mean_mb) else round(mean_mb, 3),
                # the exposed transfer (exposed_communication's cost), not its
                # `comm_exposed_ms`: one name per quantity (browser re-probe)
                "transfer_ms": ms(exposed),
                "estimate": "half of the exposed transfer",
            },
            fix=fix,
        )
    ]
