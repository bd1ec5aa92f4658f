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

from gpudiag.analysis.comms import transfer_ms
from gpudiag.analysis.findings import Finding
from gpudiag.analysis.matching import Table, key_blocks
from gpudiag.analysis.spill import SpillFile
from gpudiag.analysis.sync_points import sync_point_calls


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


# The collective table's columns last_bucket_ms reads (pipeline.analyze reads only these
# back from disk)
COLLECTIVE_READS = (
    "op",
    "step",
    "start_ns",
    "end_ns",
    "pg_name",
    "index",
    "rank",
    "dur_ms",
    "pg_size",
    "source",
    "bytes",
)


def last_bucket_ms(collectives: Table | None, spill: SpillFile | None = None) -> float | None:
    """The transfer time (ms, from the last rank's arrival) of each step's last issued
    all-reduce, the median over ranks and steps; None without timed all-reduces. A table
    kept on disk is read a block of whole matched calls (pg_name, index) at a time
    (matching.key_blocks, through ``spill``)."""
    c = collectives
    if c is None or len(c) == 0 or not {"op", "step", "start_ns", "end_ns"} <= set(c.columns):
        return None
    blocks = key_blocks(
        c, COLLECTIVE_READS, ("pg_name", "index"), spill, prepare=_timed_all_reduces
    )
    last: pd.DataFrame | None = None  # per (rank, step): the latest call's start, transfer
    for block in blocks:
        if len(block):
            latest = _latest_transfer(block.assign(transfer_ms=transfer_ms(block)))
            last = latest if last is None else _later(last, latest)
    if last is None:
        return None
    values = last["transfer_ms"]
    values = values[np.isfinite(values.to_numpy(dtype=float))]
    return float(values.median()) if len(values) else None


def _timed_all_reduces(calls: pd.DataFrame) -> pd.DataFrame:
    """The all-reduces of steps that have an end, their group names as strings; not a
    small synchronisation call (sync_points.py: a logged metric's all_reduce, which a
    gpudiag run times where it does not time DDP's buckets, is no gradient bucket)."""
    ar = calls[(calls["op"] == "all_reduce") & (pd.to_numeric(calls["step"], errors="coerce") >= 0)]
    ar = ar[pd.to_numeric(ar["end_ns"], errors="coerce").notna()]
    if {"source", "bytes"} <= set(ar.columns) and len(ar):
        sync = sync_point_calls(ar).index
        ar = ar.drop(index=sync)
    return ar.assign(pg_name=ar["pg_name"].astype(str))


def _latest_transfer(calls: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): the transfer of its call issued last (a call without a start
    counts as the latest, as it sorts last), of those whose transfer is known."""
    known = calls[calls["transfer_ms"].notna()]
    start = pd.to_numeric(known["start_ns"], errors="coerce").astype(float).fillna(np.inf)
    known = known.assign(issued=start.to_numpy())
    order = np.argsort(known["issued"].to_numpy(), kind="stable")
    latest = known.take(order).groupby(["rank", "step"])[["issued", "transfer_ms"]].last()
    return latest


def _later(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) of either: the call of the two issued later."""
    joined = a.join(b, how="outer", suffixes=("_a", "_b"))
    take_b = joined["issued_b"].fillna(-np.inf) >= joined["issued_a"].fillna(-np.inf)
    return pd.DataFrame(
        {
            "issued": joined["issued_b"].where(take_b, joined["issued_a"]),
            "transfer_ms": joined["transfer_ms_b"].where(take_b, joined["transfer_ms_a"]),
        }
    )


def _saving(
    scenario: Scenario, cost: float, collectives: Table | None, spill: SpillFile | None
) -> float:
    """The finding's cost, except for the realistic bucketing gain: the cost less the last
    bucket's all-reduce (0 when that is not known)."""
    if scenario.name != "comm_bucketed":
        return cost
    remaining = last_bucket_ms(collectives, spill)
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
    collectives: Table | None = None,
    spill: SpillFile | None = None,
    steady_ms: float | None = None,
) -> list[Projection]:
    """One projection per scenario whose finding is present with a positive cost, from the
    run's findings, per-rank table and per-step breakdown (AnalysisResult's fields).
    ``collectives`` (a DDP run's collective table) gives the realistic bucketing gain.
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
        saving = min(_saving(scenario, finding.cost_ms_per_step, collectives, spill), step_ms)
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
                assumptions=_assumptions(scenario, collectives is not None)
                + _also_gives_back(finding, findings),
            )
        )
    return projections


__all__ = [
    "COLLECTIVE_READS",
    "SCENARIOS",
    "Projection",
    "Scenario",
    "last_bucket_ms",
    "mean_step_ms",
    "project",
]
