"""Scaling: the step time at another world size (and node count), from this run.

Weak scaling: the per-rank batch stays the same, so each rank's compute is kept. The
gradient bytes per step are the run's collectives (op and size per call, per step), and
their time at N ranks comes from an alpha-beta model fitted to the durations this run
measured:

    T(op, n, bytes) = hops(op, n) * alpha + factor(op, n) * bytes / busbw

with the nccl-tests bus-bandwidth factors (all_reduce 2(n-1)/n; all_gather,
reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1) and the hop count of a ring
(all_reduce 2(n-1), the others n-1) or a tree (all_reduce 2*ceil(log2 n), the others
ceil(log2 n)). From the run, per op: per-size median durations, a least-squares line
``a + k * bytes``, then ``alpha = a / hops(n0)`` and ``busbw = factor(n0) / k``.

The run's measured communication time (waiting for peers included: on a busy host most
of it is each hop's wake-up, a latency) scales by the model's time per step at N over its
time at the measured world size, and its exposed share stays as measured. On a CPU run
(gloo, no GPU trace) the ranks share the host's cores: the busy part of the step
(compute, overlapped communication, data loading, host work) scales by the cores asked
for over the cores there are, ``max(1, (ranks_per_node * cores_per_rank + others) /
cores)``, at N over the same at the measured size, where a rank's cores and the other
processes' come from the host samples (else one core per thread); idle time (sleeps) is
kept. Docs: docs/whatif.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag.analysis.comms import busbw_factor, transfer_ms
from gpudiag.analysis.result import RunInfo
from gpudiag.analysis.whatif import step_range
from gpudiag.numfmt import ms_text

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class CollectiveFit:
    """The alpha-beta fit of one collective op of the world group."""

    op: str
    calls: int  # calls used for the fit (all ranks)
    sizes: int  # distinct message sizes
    alpha_us: float  # per-hop latency
    busbw_gbs: float  # bus bandwidth (nccl-tests), GB/s; inf: larger calls were not slower
    measured_ms_per_step: float  # mean over ranks of the op's time per step
    transfer_ms_per_step: float  # the same from the last rank's arrival (no waiting)
    bytes_per_step: float  # per rank
    matched: bool = True  # every call seen on all its group's ranks (else waits included)

    def to_json(self) -> dict[str, object]:
        return {
            "op": self.op,
            "calls": self.calls,
            "sizes": self.sizes,
            "alpha_us": self.alpha_us,
            "busbw_gbs": self.busbw_gbs if math.isfinite(self.busbw_gbs) else None,
            "measured_ms_per_step": self.measured_ms_per_step,
            "transfer_ms_per_step": self.transfer_ms_per_step,
            "bytes_per_step": self.bytes_per_step,
            "matched": self.matched,
        }


@dataclass(frozen=True)
class ScaleInputs:
    """What the model needs from the run (AnalysisResult's tables and RunInfo)."""

    world_size: int
    nodes: int
    cores_per_node: int | None
    threads_per_rank: int
    cpu_run: bool  # compute on the host (gloo, no GPU trace): ranks share the cores
    # Measured by the host sampler during the steps (None without samples): cores the
    # job's workers used per rank, and cores other processes used.
    cores_used_per_rank: float | None = None
    others_cores: float | None = None


def host_demand(
    host_samples: pd.DataFrame, steps: pd.DataFrame, cores: int | None, ranks_per_node: float
) -> tuple[float | None, float | None]:
    """(cores the job used per rank, cores other processes used): medians of the host
    samples taken during the steps, first node (None, None without samples)."""
    s = host_samples
    need = {"t_ns", "cpu_percent", "proc_cpu_percent"}
    if s is None or s.empty or not need <= set(s.columns) or not cores or ranks_per_node <= 0:
        return None, None
    if steps is not None and len(steps) and {"start_ns", "end_ns"} <= set(steps.columns):
        lo, hi = steps["start_ns"].min(), steps["end_ns"].max()
        s = s[(s["t_ns"] >= lo) & (s["t_ns"] <= hi)]
    if "node" in s and len(s):
        s = s[s["node"] == s["node"].min()]
    host = pd.to_numeric(s["cpu_percent"], errors="coerce").dropna()
    job = pd.to_numeric(s["proc_cpu_percent"], errors="coerce").dropna()
    if host.empty or job.empty:
        return None, None
    job_cores = float(np.median(job)) / 100.0
    others = max(float(np.median(host)) / 100.0 * cores - job_cores, 0.0)
    return job_cores / ranks_per_node, others


def scale_inputs(
    run: RunInfo,
    *,
    cpu_run: bool,
    cores_per_node: int | None = None,
    threads_per_rank: int | None = None,
    host_samples: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
) -> ScaleInputs:
    """The model's facts of the run: world size, nodes, cores and threads from its
    manifest (RunInfo), overridden by the caller's; the CPU the job and other processes
    used from the host samples. Threads default to 1 (torchrun sets OMP_NUM_THREADS=1
    for more than one process per node)."""
    world = int(run.world_size or len(run.ranks_present) or 1)
    nodes = int(run.nodes or 1)
    cores = cores_per_node or run.cores_per_node
    used, others = (
        host_demand(host_samples, steps, cores, world / nodes)
        if cpu_run and host_samples is not None
        else (None, None)
    )
    return ScaleInputs(
        world_size=world,
        nodes=nodes,
        cores_per_node=cores,
        threads_per_rank=int(threads_per_rank or run.threads_per_rank or 1),
        cpu_run=cpu_run,
        cores_used_per_rank=used,
        others_cores=others,
    )


def hops(op: str, n: int, algorithm: str = "ring") -> float:
    """Latency steps of one collective on ``n`` ranks."""
    if n <= 1:
        return 0.0
    two_way = op == "all_reduce"
    if algorithm == "tree":
        depth = math.ceil(math.log2(n))
        return float(2 * depth if two_way else depth)
    return float(2 * (n - 1) if two_way else n - 1)


def collective_ms(
    op: str, n: int, nbytes: float, alpha_us: float, busbw_gbs: float, algorithm: str = "ring"
) -> float:
    """Alpha-beta time (ms) of one collective of ``nbytes`` on ``n`` ranks."""
    if n <= 1:
        return 0.0
    bandwidth_ms = busbw_factor(op, n) * nbytes / (busbw_gbs * 1e6) if busbw_gbs > 0 else 0.0
    return hops(op, n, algorithm) * alpha_us / 1e3 + bandwidth_ms


def oversubscription(
    ranks_per_node: float,
    cores_per_rank: float,
    cores: int | None,
    others_cores: float = 0.0,
) -> float:
    """How many times over a node's cores are asked for (at least 1): ``ranks_per_node``
    ranks each wanting ``cores_per_rank`` cores, plus other processes' ``others_cores``."""
    if not cores or cores <= 0:
        return 1.0
    return max(1.0, (ranks_per_node * max(cores_per_rank, 0.0) + others_cores) / cores)


def _line(sizes: np.ndarray, durs: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(intercept ms, slope ms/byte), both >= 0: a weighted least-squares line; a negative
    intercept is refitted through the origin, a non-positive slope leaves the latency."""
    if len(sizes) >= 2:
        k, a = np.polyfit(sizes, durs, 1, w=np.sqrt(weights))
        if a >= 0 and k > 0:
            return float(a), float(k)
        if k > 0:  # through the origin
            return 0.0, float(np.sum(weights * sizes * durs) / np.sum(weights * sizes**2))
        return float(np.average(durs, weights=weights)), 0.0
    # one size: its time cannot be split; tiny messages are latency, others bandwidth
    if sizes[0] < 64 * 1024:
        return float(durs[0]), 0.0
    return 0.0, float(durs[0] / sizes[0])


def _world_calls(collectives: pd.DataFrame, world_size: int) -> pd.DataFrame:
    c = collectives
    need = {"op", "bytes", "dur_ms", "pg_size", "rank", "step", "start_ns", "end_ns", "index"}
    if c is None or len(c) == 0 or not need <= set(c.columns):
        return pd.DataFrame(columns=[*sorted(need), "pg_name", "transfer_ms"])
    c = c.assign(pg_name=c["pg_name"].astype(str) if "pg_name" in c else "0")
    c = c[
        (pd.to_numeric(c["pg_size"], errors="coerce") == world_size)
        & (pd.to_numeric(c["bytes"], errors="coerce") > 0)
        & (pd.to_numeric(c["step"], errors="coerce") >= 0)
        & c["op"].notna()
        & pd.to_numeric(c["dur_ms"], errors="coerce").notna()
    ]
    if not len(c):
        return c.assign(transfer_ms=[], matched=[])
    key = [c["pg_name"], c["index"]]
    seen = c["rank"].groupby(key).transform("nunique")
    return c.assign(transfer_ms=transfer_ms(c), matched=seen >= world_size)


def fit_collectives(collectives: pd.DataFrame, world_size: int) -> list[CollectiveFit]:
    """One fit per op of the world group (pg_size = world size) with measured durations:
    each call's transfer time (from the last rank's arrival, :func:`transfer_ms`), the
    median per message size (resists outliers), then a least-squares line."""
    if world_size < 2:
        return []
    c = _world_calls(collectives, world_size)
    c = c[c["transfer_ms"] > 0] if len(c) else c
    fits = []
    for op, rows in c.groupby("op", sort=True):
        per_size = rows.groupby("bytes")["transfer_ms"].agg(["median", "size"]).reset_index()
        sizes = per_size["bytes"].to_numpy(dtype=float)
        a_ms, k_ms_per_byte = _line(
            sizes, per_size["median"].to_numpy(dtype=float), per_size["size"].to_numpy(float)
        )
        h = hops(str(op), world_size)
        factor = busbw_factor(str(op), world_size)
        n_ranks = max(rows["rank"].nunique(), 1)
        n_steps = max(rows.groupby("rank")["step"].nunique().mean(), 1)
        fits.append(
            CollectiveFit(
                op=str(op),
                calls=len(rows),
                sizes=len(per_size),
                alpha_us=a_ms * 1e3 / h if h else 0.0,
                busbw_gbs=factor / (k_ms_per_byte * 1e6) if k_ms_per_byte > 0 else math.inf,
                measured_ms_per_step=float(rows["dur_ms"].sum()) / n_ranks / n_steps,
                transfer_ms_per_step=float(rows["transfer_ms"].sum()) / n_ranks / n_steps,
                bytes_per_step=float(rows["bytes"].sum()) / n_ranks / n_steps,
                matched=bool(rows["matched"].all()),
            )
        )
    return fits


def comm_ms_per_step(
    collectives: pd.DataFrame,
    fits: list[CollectiveFit],
    world_size: int,
    n: int,
    *,
    algorithm: str = "ring",
    busbw_cap_gbs: float | None = None,
) -> float:
    """The model's communication time per step at ``n`` ranks: every call of a fitted op
    of the world group (``world_size`` ranks measured) in one rank's steps, at its size
    (mean over ranks and steps)."""
    if not fits:
        return 0.0
    by_op = {f.op: f for f in fits}
    c = _world_calls(collectives, world_size)
    c = c[c["op"].isin(list(by_op))]
    if c.empty:
        return 0.0
    total = 0.0
    for op, rows in c.groupby("op"):
        f = by_op[str(op)]
        busbw = f.busbw_gbs if busbw_cap_gbs is None else min(f.busbw_gbs, busbw_cap_gbs)
        per_call = [
            collective_ms(str(op), n, b, f.alpha_us, busbw, algorithm)
            for b in rows["bytes"].to_numpy(dtype=float)
        ]
        n_ranks = max(rows["rank"].nunique(), 1)
        n_steps = max(rows.groupby("rank")["step"].nunique().mean(), 1)
        total += float(np.sum(per_call)) / n_ranks / n_steps
    return total


@dataclass(frozen=True)
class ScaleProjection:
    """The step time at ``world_size`` ranks on ``nodes`` nodes (docs/whatif.md)."""

    from_world_size: int
    world_size: int
    from_nodes: int
    nodes: int
    algorithm: str
    inter_node_link: str
    step_ms: float
    projected_step_ms: float
    projected_low_ms: float
    projected_high_ms: float
    compute_ms: float  # measured, per rank (compute + overlapped comm + host work)
    projected_compute_ms: float
    comm_exposed_ms: float
    projected_comm_exposed_ms: float
    idle_ms: float
    model_comm_ms: float  # the model's comm time per step at the measured size
    projected_model_comm_ms: float
    cores_per_node: int | None
    threads_per_rank: int
    cores_per_rank: float | None  # at the projected size
    oversubscription: float  # projected / measured
    fits: tuple[CollectiveFit, ...]
    assumptions: tuple[str, ...]

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.projected_step_ms / self.step_ms - 1.0)

    def to_json(self) -> dict[str, object]:
        return {
            "scenario": "scale",
            "from_world_size": self.from_world_size,
            "world_size": self.world_size,
            "from_nodes": self.from_nodes,
            "nodes": self.nodes,
            "algorithm": self.algorithm,
            "inter_node_link": self.inter_node_link,
            "step_ms": self.step_ms,
            "projected_step_ms": self.projected_step_ms,
            "projected_range_ms": [self.projected_low_ms, self.projected_high_ms],
            "change_pct": self.change_pct,
            "components_ms": {
                "compute": [self.compute_ms, self.projected_compute_ms],
                "comm_exposed": [self.comm_exposed_ms, self.projected_comm_exposed_ms],
                "idle": [self.idle_ms, self.idle_ms],
            },
            "model_comm_ms_per_step": [self.model_comm_ms, self.projected_model_comm_ms],
            "cores_per_node": self.cores_per_node,
            "threads_per_rank": self.threads_per_rank,
            "cores_per_rank": self.cores_per_rank,
            "oversubscription_ratio": self.oversubscription,
            "fits": [f.to_json() for f in self.fits],
            "assumptions": list(self.assumptions),
        }


def _mean(ranks: pd.DataFrame, col: str) -> float:
    if col not in ranks:
        return 0.0
    v = ranks[col].astype(float)
    return float(v.mean()) if v.notna().any() else 0.0


def project_scale(
    ranks: pd.DataFrame,
    breakdown: pd.DataFrame,
    collectives: pd.DataFrame,
    run: ScaleInputs,
    world_size: int,
    *,
    nodes: int = 1,
    algorithm: str = "ring",
    inter_node_gbps: float | None = None,
) -> ScaleProjection | None:
    """The step time at ``world_size`` ranks over ``nodes`` nodes (weak scaling), or None
    when the run has no step time. ``inter_node_gbps``: the bus bandwidth of the link
    between nodes (GB/s per rank); without it the measured link is assumed."""
    if ranks is None or ranks.empty or world_size < 1 or nodes < 1:
        return None
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}")
    step_ms = _mean(ranks, "step_ms_mean")
    if not (step_ms > 0):
        return None
    n0 = max(run.world_size, 1)
    fits = fit_collectives(collectives, n0)
    cap = inter_node_gbps if (nodes > 1 and inter_node_gbps) else None
    model0 = comm_ms_per_step(collectives, fits, n0, n0, algorithm="ring")
    model_n = comm_ms_per_step(
        collectives, fits, n0, world_size, algorithm=algorithm, busbw_cap_gbs=cap
    )
    measured = _measured_step(ranks, step_ms)
    waiting = _waiting_for_peers(measured, model0, run.cpu_run)
    comm_ratio = (model_n + waiting) / (model0 + waiting) if model0 > 0 else 1.0
    per_node = world_size / nodes
    over = _core_slowdown(run, per_node)
    busy_n = measured.busy * over
    exposed_n = measured.exposed * comm_ratio
    projected = measured.idle + busy_n + exposed_n
    low, high = step_range(breakdown, step_ms)
    scale = projected / step_ms
    link = _link_text(nodes, inter_node_gbps)
    cores = run.cores_per_node
    return ScaleProjection(
        from_world_size=n0,
        world_size=world_size,
        from_nodes=max(run.nodes, 1),
        nodes=nodes,
        algorithm=algorithm,
        inter_node_link=link,
        step_ms=step_ms,
        projected_step_ms=projected,
        projected_low_ms=low * scale,
        projected_high_ms=high * scale,
        compute_ms=measured.busy,
        projected_compute_ms=busy_n,
        comm_exposed_ms=measured.exposed,
        projected_comm_exposed_ms=exposed_n,
        idle_ms=measured.idle,
        model_comm_ms=model0,
        projected_model_comm_ms=model_n,
        cores_per_node=cores,
        threads_per_rank=run.threads_per_rank,
        cores_per_rank=(cores / per_node) if cores else None,
        oversubscription=over,
        fits=tuple(fits),
        assumptions=_assumptions(
            run,
            fits,
            algorithm=algorithm,
            waiting=waiting,
            nodes=nodes,
            link=link,
            ranks_per_node=per_node,
            over=over,
        ),
    )


@dataclass(frozen=True)
class _MeasuredStep:
    """The measured step's parts (means over ranks, ms): ``busy`` is compute, overlapped
    communication, data loading and host work; ``comm`` all communication, overlapped
    and exposed."""

    exposed: float
    idle: float
    busy: float
    comm: float


def _measured_step(ranks: pd.DataFrame, step_ms: float) -> _MeasuredStep:
    exposed = _mean(ranks, "comm_exposed")
    idle = _mean(ranks, "idle")
    return _MeasuredStep(
        exposed=exposed,
        idle=idle,
        busy=step_ms - exposed - idle,
        comm=_mean(ranks, "comm_overlapped") + exposed,
    )


def _waiting_for_peers(measured: _MeasuredStep, model0_ms: float, cpu_run: bool) -> float:
    """The part of the measured communication that is not the model's transfer, kept
    as it is at any size. CPU run: none (on a shared host the waiting is mostly each
    hop's wake-up, a latency, and scales as the model's time does). GPU run: the skew
    between ranks."""
    return 0.0 if cpu_run else max(measured.comm - model0_ms, 0.0)


def _cores_per_rank(run: ScaleInputs) -> float:
    """The cores a rank asks for: as the host samples measured, else its threads."""
    if run.cores_used_per_rank is not None:
        return run.cores_used_per_rank
    return float(run.threads_per_rank)


def _core_slowdown(run: ScaleInputs, ranks_per_node: float) -> float:
    """How much slower the busy part of the step gets at ``ranks_per_node``: the node's
    oversubscription there over the measured run's (CPU runs; 1 on GPU runs)."""
    if not run.cpu_run:
        return 1.0
    measured_per_node = max(run.world_size, 1) / max(run.nodes, 1)
    per_rank = _cores_per_rank(run)
    others = run.others_cores or 0.0
    cores = run.cores_per_node
    return oversubscription(ranks_per_node, per_rank, cores, others) / oversubscription(
        measured_per_node, per_rank, cores, others
    )


def _link_text(nodes: int, inter_node_gbps: float | None) -> str:
    if nodes <= 1:
        return "none (one node)"
    if inter_node_gbps:
        return f"{inter_node_gbps:g} GB/s bus bandwidth per rank (given)"
    return "the link this run measured (no --inter-node-gbps given)"


WEAK_SCALING = (
    "weak scaling: the per-rank batch stays the same, so each rank's compute is kept "
    "(the global batch grows with the world size)"
)


def _assumptions(
    run: ScaleInputs,
    fits: list[CollectiveFit],
    *,
    algorithm: str,
    waiting: float,
    nodes: int,
    link: str,
    ranks_per_node: float,
    over: float,
) -> tuple[str, ...]:
    """What the projection assumed, in the order the report lists it."""
    found = [
        WEAK_SCALING,
        _model_assumption(algorithm, fits),
        _comm_scaling_assumption(run.cpu_run, waiting),
        *_fit_caveats(fits),
    ]
    if nodes > 1:
        crosses = run.nodes <= 1
        found.append(
            f"across {nodes} nodes the slowest link sets the bus bandwidth: {link}"
            + ("; latency per hop as measured" if crosses else "")
        )
    if run.cpu_run:
        found.append(_cpu_assumption(run, ranks_per_node, over))
    return tuple(found)


def _fit_text(fit: CollectiveFit) -> str:
    bandwidth = (
        f"busbw {fit.busbw_gbs:.3g} GB/s)"
        if math.isfinite(fit.busbw_gbs)
        else "no bandwidth term: larger calls were not slower)"
    )
    latency = f"alpha {fit.alpha_us:.1f} us/hop"
    return f"{fit.op} ({fit.calls} calls, {fit.sizes} sizes: {latency}, {bandwidth}"


def _model_assumption(algorithm: str, fits: list[CollectiveFit]) -> str:
    fitted = ", ".join(_fit_text(f) for f in fits)
    return f"collectives: {algorithm} alpha-beta model fitted to this run's " + (
        fitted or "collectives (none with a duration: communication kept as measured)"
    )


def _comm_scaling_assumption(cpu_run: bool, waiting: float) -> str:
    how = (
        "the measured communication (waiting for peers included) scales as the "
        "model's time per step"
        if cpu_run
        else f"the waiting for peers ({ms_text(waiting)} ms/step) is kept and the transfer "
        "scales as the model"
    )
    return (
        "the same gradient bytes per step at every world size; "
        + how
        + "; the exposed share of communication stays as measured"
    )


def _fit_caveats(fits: list[CollectiveFit]) -> list[str]:
    """What weakens the fits: calls missing on some ranks, a single message size."""
    caveats = []
    unmatched = [f.op for f in fits if not f.matched]
    if unmatched:
        caveats.append(
            f"{', '.join(unmatched)}: calls not seen on every rank (traces missing), so "
            "their durations, waiting for peers included, were fitted as transfer"
        )
    if fits and any(f.sizes < 2 for f in fits):
        caveats.append(
            "one message size only: latency and bandwidth cannot be told apart "
            "(all of it taken as bandwidth, or latency below 64 KiB)"
        )
    return caveats


def _cpu_assumption(run: ScaleInputs, ranks_per_node: float, over: float) -> str:
    """How the ranks share a node's cores at the projected size (CPU runs)."""
    cores = run.cores_per_node
    cpr = (cores / ranks_per_node) if cores else None
    demand = (
        f"each rank used {_cores_per_rank(run):.2f} cores and other processes "
        f"{run.others_cores or 0.0:.2f} "
        "(host samples, medians during the steps; the other load assumed unchanged)"
        if run.cores_used_per_rank is not None
        else f"each rank wants {run.threads_per_rank} core(s) (no host samples)"
    )
    return (
        f"CPU run: {ranks_per_node:g} ranks per node on {cores or 'unknown'} cores"
        + (f" ({cpr:.2f} cores per rank)" if cpr else "")
        + f"; {demand}; compute and host work slowed {over:.2f}x: busy time scales "
        "with the cores asked for over the cores there are, once that exceeds 1"
    )


__all__ = [
    "ALGORITHMS",
    "CollectiveFit",
    "ScaleInputs",
    "ScaleProjection",
    "collective_ms",
    "comm_ms_per_step",
    "fit_collectives",
    "hops",
    "oversubscription",
    "project_scale",
    "scale_inputs",
    "transfer_ms",
]
