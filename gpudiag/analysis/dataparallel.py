"""nn.DataParallel: what its single-process multi-GPU machinery costs per step.

DP's code path (torch/nn/parallel/data_parallel.py) on every call: scatter the inputs
(host copies to each GPU), replicate the module (Broadcast / broadcast_coalesced),
parallel_apply (one Python thread per GPU), gather the outputs to device_ids[0]; in
backward, Broadcast's backward ReduceAddCoalesced sums gradients onto GPU0. On CPU
DataParallel runs with device_ids=[] and is a plain call inside the
``DataParallel.forward`` annotation: none of this happens (``dp_on_cpu``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis.classify import name_mask
from gpudiag.analysis.dataloader import _per_step_union_ms, merge_intervals, overlap_ns
from gpudiag.analysis.findings import Finding, ms, severity_for
from gpudiag.numfmt import ms_text, pct_text

DP_FORWARD_RE = re.compile(r"(?<!Distributed)DataParallel\.forward")
# Stage -> names (CPU ops, autograd nodes, Python functions) that belong to it.
STAGES: dict[str, re.Pattern[str]] = {
    "scatter": re.compile(
        r"\bScatter\b|scatter_kwargs|parallel/scatter_gather\.py.*scatter|comm\.scatter"
    ),
    "replicate": re.compile(
        r"\bBroadcast\b|broadcast_coalesced|parallel/replicate\.py|: replicate$"
    ),
    "parallel_apply": re.compile(r"parallel_apply"),
    "gather": re.compile(r"\bGather\b|parallel/scatter_gather\.py.*gather|comm\.gather|: gather$"),
    "reduce_add": re.compile(r"ReduceAddCoalesced|BroadcastBackward|reduce_add_coalesced"),
}
OVERHEAD_STAGES = ("scatter", "replicate", "gather", "reduce_add")

DDP_FIX = (
    "Replace nn.DataParallel with DistributedDataParallel: one process per GPU "
    "(torchrun --nproc-per-node N train.py), dist.init_process_group('nccl'), "
    "model = DDP(model.to(local_rank), device_ids=[local_rank]) and a DistributedSampler; "
    "this removes the per-step scatter, replicate and gather and the GPU0 hot spot."
)
DP_ON_CPU_FIX = (
    "nn.DataParallel on CPU does nothing (device_ids=[]): the model runs once, in one "
    "process. For CPU data parallelism use DistributedDataParallel with the gloo backend "
    "(torchrun --nproc-per-node N), or run on GPUs; otherwise drop the wrapper."
)


PROJECTION_ASSUMPTIONS = (
    "each GPU runs its own process on the same per-GPU batch, so its compute equals "
    "DP's parallel_apply time",
    "scatter, replicate, gather and ReduceAddCoalesced disappear",
    "DDP's gradient all-reduce overlaps backward (bucketed), so only the last "
    "bucket's all-reduce is exposed; it is not added here",
    "the loss computed on gathered outputs on GPU0 is spread over all GPUs",
)


@dataclass(frozen=True)
class DataParallelResult:
    """What nn.DataParallel's machinery costs per step in the profiled window."""

    on_cpu: bool  # device_ids=[]: DP is a plain call, nothing to measure
    forward_calls: int
    steps: int
    forward_ms_per_step: float
    stage_ms_per_step: dict[str, float]  # STAGES -> ms per step
    stage_events: dict[str, int]  # STAGES -> events matched
    copy_ms_in_forward_per_step: float
    overhead_ms_per_step: float  # scatter + replicate + gather + reduce_add
    # On CUDA only: the step without DP's overhead, and what that projection assumes.
    projected_ddp_step_ms: float | None = None
    projection_assumptions: tuple[str, ...] = ()
    detected: bool = True

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        head = {"detected": out.pop("detected"), "on_cpu": out.pop("on_cpu")}
        if self.projected_ddp_step_ms is None:
            out.pop("projected_ddp_step_ms")
            out.pop("projection_assumptions")
        return {**head, **out}


def _contains(ev: pd.DataFrame, pattern: re.Pattern[str]) -> np.ndarray:
    return name_mask(ev["name"], lambda names: names.str.contains(pattern))


def _dp_windows(ev: pd.DataFrame) -> pd.DataFrame:
    return ev[_contains(ev, DP_FORWARD_RE) & ~ev["is_gpu"].to_numpy(dtype=bool)]


_COPY_OPS = ("aten::to", "aten::_to_copy")  # explicit transfers, not copy_ inside modules


def _input_copies(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Main-thread tensor copies inside DataParallel.forward before its replicate (or
    parallel_apply) starts: the scatter of the inputs to the GPUs."""
    ws, we = merge_intervals(windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy())
    copy_op = name_mask(ev["name"], lambda names: names.isin(_COPY_OPS))
    copies = ev[ev["main_thread"].to_numpy(dtype=bool) & copy_op]
    if copies.empty or not len(ws):
        return copies.iloc[0:0]
    later = ev[_contains(ev, STAGES["replicate"]) | _contains(ev, STAGES["parallel_apply"])]
    first_later = np.full(len(ws), np.iinfo(np.int64).max)
    if len(later):
        lw = np.searchsorted(ws, later["start_ns"].to_numpy(), side="right") - 1
        ok = (lw >= 0) & (later["start_ns"].to_numpy() < we[np.clip(lw, 0, None)])
        np.minimum.at(first_later, lw[ok], later["start_ns"].to_numpy()[ok])
    start = copies["start_ns"].to_numpy()
    cw = np.searchsorted(ws, start, side="right") - 1
    inside = (cw >= 0) & (start < we[np.clip(cw, 0, None)])
    before = inside & (start < first_later[np.clip(cw, 0, None)])
    return copies[before]


def _apply_wait_ms(cpu_ev: pd.DataFrame, ws: np.ndarray, we: np.ndarray) -> tuple[float, int]:
    """parallel_apply as the main thread lives it: in each DataParallel.forward, from the
    end of the replicate to the start of the gather it waits for the replica threads.
    The profiler records no op of those threads (seen on an H200, torch 2.11: only their
    cudaLaunchKernel calls), so their own work cannot be summed. Returns (ms, windows)."""
    main = cpu_ev[cpu_ev["main_thread"].to_numpy(dtype=bool)]
    replicate = main[_contains(main, STAGES["replicate"])]
    gather = main[_contains(main, STAGES["gather"])]
    total_ns, windows = 0, 0
    for start, end in zip(ws, we, strict=True):
        rep_end = replicate["end_ns"][
            (replicate["start_ns"] >= start) & (replicate["end_ns"] <= end)
        ]
        gat_start = gather["start_ns"][(gather["start_ns"] >= start) & (gather["end_ns"] <= end)]
        if len(rep_end) and len(gat_start) and gat_start.min() > rep_end.max():
            total_ns += int(gat_start.min() - rep_end.max())
            windows += 1
    return total_ns / 1e6, windows


def trace_dataparallel(trace: Any) -> DataParallelResult | None:
    """Per-rank DP stage costs (ms/step), or None when the trace has no DataParallel
    (cached on the trace)."""
    result: DataParallelResult | None = trace.cached(
        "dataparallel", lambda: _trace_dataparallel(trace)
    )
    return result


def _trace_dataparallel(trace: Any) -> DataParallelResult | None:
    ev = trace.events
    windows = _dp_windows(ev)
    if windows.empty:
        return None
    steps = trace.steps
    n_steps = int(len(steps)) if steps is not None and len(steps) else 0
    cpu = ~ev["is_gpu"].to_numpy(dtype=bool)
    has_gpu = bool(ev["is_gpu"].to_numpy(dtype=bool).any()) or bool(trace.meta.device_properties)
    stages: dict[str, float] = {}
    counts: dict[str, int] = {}
    for stage, pattern in STAGES.items():
        hits = ev[cpu & _contains(ev, pattern)]
        if stage == "scatter" and has_gpu:
            hits = pd.concat([hits, _input_copies(ev, windows)])
        counts[stage] = int(len(hits))
        total = _per_step_union_ms(hits, steps).sum() if n_steps else hits["dur_ns"].sum() / 1e6
        stages[stage] = float(total / n_steps) if n_steps else float(total)
    ws, we = merge_intervals(windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy())
    if has_gpu and not counts["parallel_apply"]:
        apply_ms, counts["parallel_apply"] = _apply_wait_ms(ev[cpu], ws, we)
        stages["parallel_apply"] = apply_ms / n_steps if n_steps else apply_ms
    copies = ev[ev["kind"] == "memcpy"]
    cs, ce = merge_intervals(copies["start_ns"].to_numpy(), copies["end_ns"].to_numpy())
    forward_ms = float(np.sum(we - ws)) / 1e6
    return DataParallelResult(
        on_cpu=not has_gpu and not any(counts[s] for s in OVERHEAD_STAGES),
        forward_calls=int(len(windows)),
        steps=n_steps,
        forward_ms_per_step=forward_ms / n_steps if n_steps else forward_ms,
        stage_ms_per_step=stages,
        stage_events=counts,
        copy_ms_in_forward_per_step=overlap_ns(ws, we, cs, ce) / 1e6 / max(n_steps, 1),
        overhead_ms_per_step=float(sum(stages[s] for s in OVERHEAD_STAGES)),
    )


def analyze_dataparallel(traces: list[Any], step_ms: float) -> DataParallelResult | None:
    per_rank = [d for t in traces if (d := trace_dataparallel(t)) is not None]
    if not per_rank:
        return None
    d = per_rank[0]  # DataParallel is one process: one trace
    if not d.on_cpu and step_ms > 0:
        return replace(
            d,
            projected_ddp_step_ms=max(step_ms - d.overhead_ms_per_step, 0.0),
            projection_assumptions=PROJECTION_ASSUMPTIONS,
        )
    return d


def dataparallel_findings(info: DataParallelResult | None, step_ms: float) -> list[Finding]:
    if info is None:
        return []
    if info.on_cpu:
        return [
            Finding(
                kind="dp_on_cpu",
                severity="low",
                cost_ms_per_step=0.0,
                ranks=[0],
                title="nn.DataParallel runs on CPU, where it does nothing (device_ids=[])",
                evidence={
                    "forward_calls": info.forward_calls,
                    "dp_forward_ms_per_step": ms(info.forward_ms_per_step),
                    "scatter_replicate_gather_events": sum(
                        info.stage_events[s] for s in OVERHEAD_STAGES
                    ),
                },
                fix=DP_ON_CPU_FIX,
            )
        ]
    cost = info.overhead_ms_per_step
    severity = severity_for(cost, step_ms)
    if severity is None:
        return []
    return [
        Finding(
            kind="dataparallel_overhead",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=[0],
            title=(
                f"DataParallel scatter/replicate/gather costs {ms_text(cost)} ms per step "
                f"({pct_text(100 * cost / step_ms)})"
            ),
            evidence={
                **{f"{k}_ms": ms(v) for k, v in info.stage_ms_per_step.items()},
                "step_ms": ms(step_ms),
                "projected_ddp_step_ms": ms(
                    info.projected_ddp_step_ms
                    if info.projected_ddp_step_ms is not None
                    else float("nan")
                ),
            },
            fix=DDP_FIX,
        )
    ]
