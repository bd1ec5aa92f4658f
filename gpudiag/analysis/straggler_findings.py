"""Straggler findings: a rank the others wait for at each collective, its cost net of the
host's doing, the hedges that keep it low when the host may be to blame, and the link to
the finding on the same rank that causes it (docs/findings.md).

Moved out of findings.py (issue 33); the finding kinds, severity rules and the other
communication findings stay there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpudiag.analysis.findings import Finding, ms, severity_for
from gpudiag.analysis.slow_rank import SlowRankCause
from gpudiag.numfmt import ms_text, plural

STRAGGLER_FIX = (
    "Every other rank waits for this one at each collective. Compare its host (CPU "
    "load, other processes, throttled or older GPU, slower NIC/PCIe slot), its data "
    "shard (uneven batch sizes or sequence lengths) and any rank-specific work (logging, "
    "checkpointing, evaluation on rank 0 only inside the step)."
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


STRAGGLER_FIXES = {
    "data": (
        "This rank waits longer for its batches than the others: check its data shard "
        "(uneven sample sizes or sequence lengths, a slower file system path), give its "
        "DataLoader more num_workers / prefetch_factor, and move rank-specific "
        "preprocessing out of the step."
    ),
    "starved": (
        "This rank was runnable but waiting for a CPU: other processes (or too many "
        "threads of the job itself) held the host's cores. Keep other work off the host, "
        "set OMP_NUM_THREADS to the cores per rank, or pin each rank to its own cores."
    ),
    "compute": (
        "This rank computes more per step than the others: look for rank-specific work "
        "inside the step (logging, metrics, evaluation or checkpointing on one rank), "
        "uneven inputs (sequence lengths, batch sizes) and, on GPUs, a slower or "
        "throttled device."
    ),
    "slower_core": (
        "This rank runs the same ops as the others, as many times, each slower: its CPU "
        "cores are shared (other processes, hyper-thread siblings, too many threads of the "
        "job) or slower. Keep other work off the host, set OMP_NUM_THREADS to the cores per "
        "rank, or pin each rank to cores of its own (taskset, numactl)."
    ),
    "blocked": (
        "This rank sleeps or blocks outside data loading and collectives: look for "
        "rank-specific blocking work in the step (writing logs or checkpoints, a lock, a "
        "time.sleep, a blocking call to another service) and move it out of the step or "
        "to a background thread."
    ),
}


def straggler_findings(
    stragglers: Any,
    step_ms: float,
    contention: dict[str, Any] | None = None,
    rank_nodes: dict[int, int] | None = None,
    ended_early: bool = False,
    causes: dict[int, SlowRankCause] | None = None,
    run_steps: int | None = None,
    runq_ms: float | None = None,
) -> list[Finding]:
    """Ranks flagged by stragglers.py, costed net of the mutual waiting: what the others
    wait for a rank minus the most any other rank makes them wait (two ranks that take
    turns arriving last are jitter, not a straggler). ``run_steps``: the steps of the run
    (its steady steps); when the collectives matched fewer (one end-of-epoch call), the
    cost is spread over the run's steps, not over the steps that had a collective.
    ``causes`` (slow_rank.explain) say where the named rank's extra time goes; the
    severity is capped at low (docs/findings.md) when fewer than stragglers.MIN_STEPS
    steps were matched, when lateness that often is likely by chance, when the run failed
    or hung (``ended_early``: its failure is the finding), and when the rank was starved
    of CPU by other processes: from its run-queue delay where the run recorded it, else
    from the host's CPU samples (``contention``, host.host_contention)."""
    if stragglers is None or len(stragglers) == 0 or "is_straggler" not in stragglers:
        return []
    costed = _net_straggler_costs(stragglers, step_ms, run_steps)
    if costed is None:
        return []
    net, best_other, column, spread = costed
    ranks = sorted(net)
    worst = max(net.values())
    named = stragglers[stragglers["rank"].isin(ranks)]
    consistent = bool(named["consistent"].all()) if "consistent" in named else True
    chance = _chance_of_lateness(named, len(stragglers))
    by_chance = chance is not None and chance > MAX_CHANCE_OF_LATENESS
    known = {r: causes[r] for r in ranks if causes and r in causes}
    hedge = _StragglerHedge.of(known, contention, worst, runq_ms)
    severity = severity_for(worst, step_ms) or "low"
    if not consistent or by_chance or ended_early or hedge.says_less:
        severity = "low"
    consistency = _consistency(named, consistent, chance)
    # a multi-node job: say on which node each named rank runs
    nodes = rank_nodes if rank_nodes and len(set(rank_nodes.values())) > 1 else {}
    where = {r: f"{r} (node {nodes[r]})" if r in nodes else str(r) for r in ranks}
    title = (
        f"Rank{'s' if len(ranks) > 1 else ''} {', '.join(where[r] for r in ranks)} arrive"
        f"{'' if len(ranks) > 1 else 's'} last at collectives; the others wait "
        f"{ms_text(worst)} ms per step"
        + _straggler_hedges(consistency, consistent, chance if by_chance else None, run_steps)
        + hedge.words(bool(known))
        # why a costly straggler is low (browser re-probe: 91 % of the step, low, unsaid)
        + (" (low: the run failed or hung, and that is its finding)" if ended_early else "")
    )
    # where its time goes is a per-step claim: only for a straggler late step after step
    cause = known.get(ranks[0]) if len(ranks) == 1 and consistent and not by_chance else None
    why = cause.sentence() if cause is not None else ""
    return [
        Finding(
            kind="straggler",
            severity=severity,
            cost_ms_per_step=worst,
            ranks=ranks,
            title=title + (f". {why}" if why else ""),
            evidence={
                "net_wait_ms_per_step": {str(r): ms(v) for r, v in net.items()},
                "others_max_wait_caused_ms": ms(best_other),
                "cost_basis": column,
                **({"spread_over_run_steps": run_steps} if spread < 1 else {}),
                **_per_rank_evidence(stragglers),
                "step_ms": ms(step_ms),
                **({"nodes": {str(r): nodes[r] for r in ranks if r in nodes}} if nodes else {}),
                **consistency,
                **({"host_cpu": contention} if contention else {}),
                **({"starved_of_cpu": hedge.starved}),
                **({"unexplained_on_busy_host": True} if hedge.unexplained_on_busy_host else {}),
                **(cause.evidence() if cause is not None else {}),
            },
            fix=_straggler_fix(cause),
        )
    ]


def _straggler_fix(cause: SlowRankCause | None) -> str:
    if cause is None:
        return STRAGGLER_FIX
    if cause.same_ops_slower:
        return STRAGGLER_FIXES["slower_core"]
    return STRAGGLER_FIXES.get(cause.main or "", STRAGGLER_FIX)


def _net_straggler_costs(
    stragglers: Any, step_ms: float, run_steps: int | None
) -> tuple[dict[int, float], float, str, float] | None:
    """Each flagged rank's cost net of the most any other rank makes the others wait
    (kept where that is still a finding), that most, the cost column and the spread
    over the run's steps; None when no rank is a straggler."""
    # The median over steps resists a few steps where one rank was descheduled (shared
    # hosts): a real straggler is late in most steps.
    column = "median_cost_ms" if "median_cost_ms" in stragglers else "cost_ms_per_step"
    cost = stragglers[column].astype(float).fillna(0).to_numpy()
    flagged = stragglers["is_straggler"].astype(bool).to_numpy()
    if not flagged.any() or (len(stragglers) > 1 and flagged.all()):
        return None
    spread = spread_over_run(stragglers, run_steps)
    cost = cost * spread
    best_other = max((c for c, f in zip(cost, flagged, strict=False) if not f), default=0.0)
    net = {
        int(r): float(c - best_other)
        for r, c, f in zip(stragglers["rank"], cost, flagged, strict=False)
        if f and severity_for(c - best_other, step_ms)
    }
    return (net, best_other, column, spread) if net else None


# Parts of a slow rank's time that are its own doing (slow_rank.PARTS less "starved")
_OWN_CAUSES = ("data", "compute", "blocked")


@dataclass(frozen=True)
class _StragglerHedge:
    """Why a straggler may be the host's doing rather than its own: starved of CPU, a
    lead no longer than the ranks' own wait for a CPU, or a busy host and nothing of the
    rank's own time to explain it."""

    starved: bool
    scheduler_sized: bool
    unexplained_on_busy_host: bool
    runq_ms: float | None
    # the same ops as the others, each slower, while other processes held the host: a
    # core it shared, not work of its own
    slower_core_on_busy_host: bool = False

    @classmethod
    def of(
        cls,
        known: dict[int, SlowRankCause],
        contention: dict[str, Any] | None,
        worst: float,
        runq_ms: float | None,
    ) -> _StragglerHedge:
        if known:
            starved = any(c.starved for c in known.values())
        else:  # no run-queue figures: the host's samples are all there is
            starved = bool(contention and contention.get("contended"))
        # a lead no longer than the ranks' own wait for a CPU per step (``runq_ms``, the
        # median rank's): the scheduler alone can make a rank that late on a busy host,
        # unless the rank's own time explains it (more data wait, CPU work, or blocking)
        own = bool(known) and all(c.main in _OWN_CAUSES for c in known.values())
        scheduler_sized = runq_ms is not None and worst <= runq_ms and not own
        # other processes kept the host's CPUs busy and no part of the rank's own time
        # (data, compute, blocked) explains the lead: it may be the scheduler's
        unexplained = (
            bool(known)
            and not starved
            and all(c.main is None for c in known.values())
            and bool(contention and contention.get("contended"))
        )
        slower_core = (
            bool(known)
            and all(c.same_ops_slower for c in known.values())
            and bool(contention and contention.get("contended"))
        )
        return cls(starved, scheduler_sized, unexplained, runq_ms, slower_core)

    @property
    def says_less(self) -> bool:
        return (
            self.starved
            or self.scheduler_sized
            or self.unexplained_on_busy_host
            or self.slower_core_on_busy_host
        )

    def words(self, known: bool) -> str:
        text = _starved_words(self.starved, known)
        if self.scheduler_sized and self.runq_ms is not None:
            text += (
                f" (no more than the ranks' own wait for a CPU, {ms_text(self.runq_ms)} ms per "
                "step: the scheduler alone can make a rank this late)"
            )
        if self.unexplained_on_busy_host:
            text += (
                " (other processes kept this host's CPUs busy, and no part of the rank's own "
                "time explains the lead: it may be the scheduler's)"
            )
        if self.slower_core_on_busy_host:
            text += (
                " (low: it ran the same ops as the other ranks, each slower, while other "
                "processes kept this host's CPUs busy: a shared core, likely not the job's)"
            )
        return text


# A straggler whose extra time is mostly of one part (slow_rank.PARTS) is caused by the
# finding of this kind on the same rank, when there is one.
_CAUSE_KINDS = {"data": "dataloader_stall"}


def link_straggler_causes(findings: list[Finding]) -> None:
    """Link a straggler to the finding on the same rank that causes it (its data wait:
    ``dataloader_stall``): the straggler's evidence names it (``caused_by``) and its title
    says so, so the same milliseconds are read, and projected (whatif), once."""
    for straggler in (f for f in findings if f.kind == "straggler"):
        kind = _CAUSE_KINDS.get(str(straggler.evidence.get("main_cause")))
        cause = next(
            (
                f
                for f in findings
                if f.kind == kind and set(straggler.ranks) <= set(f.ranks) and f is not straggler
            ),
            None,
        )
        if cause is None:
            continue
        straggler.evidence["caused_by"] = cause.kind
        straggler.title += (
            f" Its cause is the {cause.kind} finding on the same rank: fixing that gives "
            "this time back (not in addition to it)."
        )


def spread_over_run(stragglers: Any, run_steps: int | None) -> float:
    """The share of the run's steps that had matched collectives (1 when they all did or
    the run's steps are unknown): a wait at one end-of-epoch call is spread over them."""
    if not run_steps or "steps" not in stragglers or not len(stragglers):
        return 1.0
    matched = int(stragglers["steps"].astype(float).max())
    return min(matched / run_steps, 1.0) if matched > 0 else 1.0


def _consistency(named: Any, consistent: bool, chance: float | None) -> dict[str, Any]:
    if "last_share" not in named:
        return {}
    return {
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


def _straggler_hedges(
    consistency: dict[str, Any], consistent: bool, chance: float | None, run_steps: int | None
) -> str:
    matched = consistency.get("steps_matched", 0)
    if not consistent:
        spread = (
            f", the wait spread over the run's {run_steps} steps"
            if run_steps and matched < run_steps
            else ""
        )
        return (
            f" (collectives in only {plural(matched, 'step')}{spread}: not shown to be consistent)"
        )
    if chance is not None:
        late = min(consistency.get("late_share_of_steps", {}).values(), default=0)
        return (
            f" (late in {late:.0%} of {matched} matched steps, which chance alone gives "
            f"with p = {chance:.2g}: not shown to be consistent)"
        )
    return ""


def _starved_words(starved: bool, measured: bool) -> str:
    if not starved:
        return ""
    if measured:
        return (
            "; most of its extra time it was runnable but waiting for a CPU (other "
            "processes held the cores): the host, not the rank, made it late"
        )
    return "; other processes kept the host's CPUs saturated, so it may just have had less CPU time"


def _per_rank_evidence(stragglers: Any) -> dict[str, Any]:
    return {
        "mean_cost_ms_per_step": {
            str(int(r)): ms(c)
            for r, c in zip(stragglers["rank"], stragglers["cost_ms_per_step"], strict=False)
        },
        "mean_skew_ms": {
            str(int(r)): ms(v)
            for r, v in zip(stragglers["rank"], stragglers["mean_skew_ms"], strict=False)
        },
        "last_arrivals": {
            str(int(r)): int(n)
            for r, n in zip(stragglers["rank"], stragglers.get("last_count", []), strict=False)
        },
    }
