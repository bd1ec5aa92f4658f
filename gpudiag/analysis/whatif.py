"""What if: the step time a fix would give, before making it.

Each scenario is the fix of one finding kind, and its saving is that finding's cost: by
definition (docs/findings.md) ``cost_ms_per_step`` is the time the fix gives back, so the
projection and the finding always show the same number. When a kind has several findings
(one per rank), the largest cost is taken: the job waits for its slowest rank, and the
others' costs overlap with it.

Projected step = the run's steady step (else the measured mean step) − saving. The
range shifts the measured per-step
times (10th to 90th percentile of the analysed steps) by the same saving. Projections are
checked against re-recorded jobs in tests/test_whatif.py and docs/whatif.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag.analysis.findings import Finding
from gpudiag.analysis.matching import Table
from gpudiag.analysis.store import CallStore, median_sql
from gpudiag.analysis.sync_points import SYNC_POINT_SQL


@dataclass(frozen=True)
class Scenario:
    name: str
    finding_kind: str
    description: str
    assumptions: tuple[str, ...]
    # the finding must carry this evidence key (requires) or must not (excludes)
    requires: str | None = None
    excludes: str | None = None

    def applies_to(self, finding: Finding) -> bool:
        evidence = finding.evidence if isinstance(finding.evidence, dict) else {}
        return (
            finding.kind == self.finding_kind
            and (self.requires is None or self.requires in evidence)
            and (self.excludes is None or self.excludes not in evidence)
        )


# an exposed_communication finding that counted DDP's gradient all-reduce rounds
MICROSTEP_SYNC = "gradient_sync_rounds_per_step"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "straggler_fixed",
        "straggler",
        "every rank as fast as the others",
        (
            "the other ranks stop waiting for the slow rank's lead at each collective",
            "the slow rank's own extra work disappears (its cause is fixed, not moved)",
        ),
    ),
    Scenario(
        "dataloader_fixed",
        "dataloader_stall",
        "no data wait",
        ("batches are ready when the step asks (enough workers, pinned memory, prefetch)",),
    ),
    Scenario(
        "comm_overlapped",
        "exposed_communication",
        "communication fully hidden behind compute (the bound)",
        (
            "every collective overlaps computation; better bucketing reaches part of this",
            "waiting for late peers (arrival skew) is not included: overlap does not give "
            "it back (a straggler's share: see straggler_fixed)",
        ),
        excludes=MICROSTEP_SYNC,
    ),
    Scenario(
        "no_sync",
        "exposed_communication",
        "gradient accumulation with no_sync() on the non-final micro-steps",
        (
            "DDP all-reduces the gradients once per optimizer step instead of once per "
            "micro-step: (K-1)/K of the exposed communication goes, its waits for late "
            "peers included",
            "a floor: the bucket copies of the skipped rounds and, on a CPU host, the "
            "cores their threads took are given back too (measured 1.6-3.2x this on 2-rank "
            "CPU jobs)",
        ),
        requires=MICROSTEP_SYNC,
    ),
    Scenario(
        "comm_bucketed",
        "exposed_communication",
        "better DDP bucketing: only the last bucket's all-reduce stays exposed (realistic)",
        (
            "the gradients computed last cannot overlap anything: the step's last gradient "
            "bucket's all-reduce, at its measured transfer time (median over ranks and "
            "steps, from the last rank's arrival), stays exposed; every earlier bucket "
            "hides behind backward",
            "at most the bound (comm_overlapped); a smaller last bucket (bucket_cap_mb) "
            "would expose less",
        ),
        excludes=MICROSTEP_SYNC,
    ),
    Scenario(
        # the gpu_idle verdict says "about N ms/step back": its projection (probe 31j, D6:
        # no What-if row had it)
        "gpu_idle_filled",
        "gpu_idle",
        "no GPU idle time outside data loading and communication (the bound)",
        (
            "the host queues work ahead of the GPU (fewer, larger launches; CUDA graphs or "
            "torch.compile; no syncs in the step), so the GPU never waits for it",
            "an upper bound: the host's own work in that time (GPU idle · host busy) has to "
            "move off the step's critical path, not only get faster",
        ),
        requires="host_busy_ms_per_step",
    ),
    Scenario(
        "no_host_sync",
        "host_sync",
        "no host-device synchronisation inside the step",
        ("metrics stay on the device; .item() only every N steps",),
    ),
    Scenario(
        "amp",
        "no_amp",
        "mixed precision for the GEMMs",
        (
            "half of the fp32 GEMM time is saved (tensor cores at least 2x faster)",
            "a floor: on newer GPUs bf16 GEMMs are several times faster (an H200 job: "
            "13.95 ms/step in fp32, 2.73 ms measured in bf16, 5.38 ms projected)",
        ),
    ),
    Scenario(
        "ddp",
        "dataparallel_overhead",
        "the DataParallel step as DistributedDataParallel",
        (
            "one process per GPU on the same per-GPU batch: scatter, replicate and gather go",
            "DDP's bucketed all-reduce overlaps backward (not added)",
            "a floor: parallel_apply counts as compute, though part of it is a Python "
            "thread started per replica in every forward; on a small model that is most of "
            "it (an H200 job: DP 12.78 ms/step, projected 11.17, DDP measured 5.50)",
        ),
    ),
)


@dataclass(frozen=True)
class Projection:
    scenario: str
    description: str
    finding_kind: str
    ranks: tuple[int, ...]
    step_ms: float
    projected_step_ms: float
    projected_low_ms: float
    projected_high_ms: float
    saving_ms: float
    saving_pct: float
    assumptions: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "description": self.description,
            "finding_kind": self.finding_kind,
            "ranks": list(self.ranks),
            "step_ms": self.step_ms,
            "projected_step_ms": self.projected_step_ms,
            "projected_range_ms": [self.projected_low_ms, self.projected_high_ms],
            "saving_ms": self.saving_ms,
            "saving_pct": self.saving_pct,
            "assumptions": list(self.assumptions),
        }


def mean_step_ms(ranks: pd.DataFrame) -> float:
    """The step time every view shows: mean over ranks of each rank's mean step."""
    if ranks is None or ranks.empty:
        return float("nan")
    return float(ranks["step_ms_mean"].astype(float).mean())


def step_range(breakdown: pd.DataFrame, step_ms: float) -> tuple[float, float]:
    """10th and 90th percentile of the analysed steps, each the mean over ranks (the same
    averaging as the mean step time)."""
    b = breakdown
    if b is None or b.empty:
        return step_ms, step_ms
    per_step = b.groupby("step")["step_ms"].mean().to_numpy(dtype=float)
    per_step = per_step[np.isfinite(per_step)]
    if not len(per_step):
        return step_ms, step_ms
    low, high = np.percentile(per_step, [10, 90])
    return float(low), float(high)


def _costliest(findings: list[Finding], scenario: Scenario) -> Finding | None:
    of_kind = [f for f in findings if scenario.applies_to(f) and math.isfinite(f.cost_ms_per_step)]
    return max(of_kind, key=lambda f: f.cost_ms_per_step, default=None)


def _caused_elsewhere(finding: Finding, findings: list[Finding]) -> bool:
    """A finding another one causes (straggler_findings.link_straggler_causes: a straggler slowed
    by its own data wait): its time is projected once, by the cause's scenario."""
    cause = finding.evidence.get("caused_by") if isinstance(finding.evidence, dict) else None
    return bool(cause) and any(f.kind == cause for f in findings)


def _also_gives_back(finding: Finding, findings: list[Finding]) -> tuple[str, ...]:
    """The assumption a cause's projection adds: the findings it also removes."""
    caused = [
        f.kind
        for f in findings
        if isinstance(f.evidence, dict) and f.evidence.get("caused_by") == finding.kind
    ]
    return tuple(
        f"this also removes the {kind} finding it causes (the same time, counted once)"
        for kind in caused
    )


def last_bucket_ms(calls: Table | CallStore | None) -> float | None:
    """The transfer time (ms, from the last rank's arrival) of each step's last issued
    all-reduce, the median over ranks and steps; None without timed all-reduces. One
    query of the call store (a table is put in a store of its own first)."""
    if calls is None or isinstance(calls, CallStore):
        return None if calls is None else _last_bucket_of(calls)
    if len(calls) == 0:
        return None
    with CallStore.of(calls) as store:
        return _last_bucket_of(store)


def _last_bucket_of(store: CallStore) -> float | None:
    out = store.query(_LAST_BUCKET_SQL)
    return float(out["median"].iloc[0]) if len(out) else None


# The timed all-reduces of steps, not small synchronisation calls (sync_points.py: a
# logged metric's all_reduce, which a gpudiag run times where it does not time DDP's
# buckets, is no gradient bucket); each call's transfer (from the last rank's arrival at the
# k-th call of its group, the calls matched on (pg_name, index); its whole duration where
# a rank of the group has no k-th call); per (rank, step) the transfer of the call issued last (one
# without a start counts as the latest; on a tie, the later row), of those known.
_LAST_BUCKET_SQL = f"""
    WITH buckets AS (
        SELECT * FROM calls
        WHERE op = 'all_reduce' AND step >= 0 AND end_ns IS NOT NULL AND NOT ({SYNC_POINT_SQL})
    ),
    matched AS (
        SELECT pg_name, "index", max(start_ns) AS last_ns, count(DISTINCT rank) AS seen
        FROM buckets GROUP BY pg_name, "index"
    ),
    transfers AS (
        SELECT added, rank, step, coalesce(start_ns, CAST('inf' AS DOUBLE)) AS issued,
            CASE WHEN seen >= coalesce(pg_size, CAST('inf' AS DOUBLE))
                    AND (end_ns - last_ns) / 1e6 >= 0
                THEN (end_ns - last_ns) / 1e6 ELSE dur_ms END AS transfer_ms
        FROM buckets JOIN matched USING (pg_name, "index")
    ),
    latest AS (
        SELECT 0 AS run, transfer_ms FROM (
            SELECT transfer_ms, row_number() OVER (
                PARTITION BY rank, step ORDER BY issued DESC, added DESC) AS i
            FROM transfers WHERE transfer_ms IS NOT NULL
        ) WHERE i = 1 AND isfinite(transfer_ms)
    )
    {median_sql("SELECT * FROM latest", ["run"], "transfer_ms")}
"""


def _saving(scenario: Scenario, cost: float, calls: CallStore | None) -> float:
    """The finding's cost, except for the realistic bucketing gain: the cost less the last
    bucket's all-reduce (0 when that is not known)."""
    if scenario.name != "comm_bucketed":
        return cost
    remaining = last_bucket_ms(calls)
    return 0.0 if remaining is None else max(cost - remaining, 0.0)


def _assumptions(scenario: Scenario, ddp: bool) -> tuple[str, ...]:
    """The scenario's assumptions; "better bucketing" only on a DDP run (``ddp``: the
    pipeline passes the collective table only there): a Megatron TP run's all-reduces
    are not buckets (issue 31, D)."""
    if scenario.name == "comm_overlapped" and not ddp:
        return ("every collective overlaps computation",) + scenario.assumptions[1:]
    return scenario.assumptions


def project(
    findings: list[Finding],
    ranks: pd.DataFrame,
    breakdown: pd.DataFrame,
    calls: CallStore | None = None,
    steady_ms: float | None = None,
) -> list[Projection]:
    """One projection per scenario whose finding is present with a positive cost, from the
    run's findings, per-rank table and per-step breakdown (AnalysisResult's fields).
    ``calls`` (a DDP run's call store) gives the realistic bucketing gain.
    ``steady_ms`` (the run's steady step, steady.py) is the step projected from when the
    run has one, with the profiled window's spread around it."""
    step_ms = steady_ms if steady_ms is not None and steady_ms > 0 else mean_step_ms(ranks)
    if not (step_ms > 0):
        return []
    low, high = step_range(breakdown, mean_step_ms(ranks))
    if steady_ms is not None and steady_ms > 0:  # the window's spread, around the steady step
        shift = steady_ms - mean_step_ms(ranks)
        low, high = (low + shift, high + shift) if math.isfinite(shift) else (step_ms, step_ms)
    projections = []
    for scenario in SCENARIOS:
        finding = _costliest(findings, scenario)
        if finding is None or not (finding.cost_ms_per_step > 0):
            continue
        if _caused_elsewhere(finding, findings):
            continue
        saving = min(_saving(scenario, finding.cost_ms_per_step, calls), step_ms)
        if not (saving > 0):
            continue
        projections.append(
            Projection(
                scenario=scenario.name,
                description=scenario.description,
                finding_kind=scenario.finding_kind,
                ranks=tuple(int(r) for r in finding.ranks),
                step_ms=step_ms,
                projected_step_ms=step_ms - saving,
                projected_low_ms=max(low - saving, 0.0),
                projected_high_ms=max(high - saving, 0.0),
                saving_ms=saving,
                saving_pct=100.0 * saving / step_ms,
                assumptions=_assumptions(scenario, calls is not None)
                + _also_gives_back(finding, findings),
            )
        )
    return projections


__all__ = [
    "SCENARIOS",
    "Projection",
    "Scenario",
    "last_bucket_ms",
    "mean_step_ms",
    "project",
]
