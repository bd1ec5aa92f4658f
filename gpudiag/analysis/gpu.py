"""GPU health: kernel-busy fraction (traces), NVML utilisation over the whole run,
memory headroom, throttle reasons with their time share, and GPU0 imbalance."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analysis import intervals as iv
from gpudiag.analysis.breakdown import startup_ns, step_windows
from gpudiag.analysis.classify import name_mask
from gpudiag.analysis.dataloader import _window_of
from gpudiag.analysis.findings import Finding, ms, severity_for
from gpudiag.analysis.jsonable import rows_of, whole
from gpudiag.numfmt import ms_text, pct_text

# NVML clock-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*).
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that slow a busy GPU down (idle, app clocks and sync boost are not throttling).
PERF_THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

GPU_KINDS = ("compute", "comm", "memcpy", "memset")

THROTTLE_FIX = (
    "The GPU lowered its clocks: check cooling and airflow (nvidia-smi -q -d "
    "TEMPERATURE,PERFORMANCE), the power limit (nvidia-smi -pl), and other jobs on the "
    "node; thermal or power-brake slowdown on one GPU also makes its rank a straggler."
)
GPU_IDLE_FIX = (
    "The GPU waits on the host: feed it faster (DataLoader workers, pin_memory, "
    "non_blocking copies), remove per-step .item()/synchronize calls, use larger batches, "
    "CUDA graphs (torch.compile(mode='reduce-overhead')) for launch-bound small kernels."
)
IMBALANCE_FIX = (
    "nn.DataParallel gathers outputs and computes the loss on GPU0 and replicates from "
    "it every step: switch to DistributedDataParallel (one process per GPU, "
    "torchrun --nproc-per-node N) so every GPU does the same work."
)


@dataclass(frozen=True)
class KernelBusy:
    """One rank's GPU activity over its profiled steps (GPU traces only)."""

    rank: int
    busy_fraction: float  # some kernel or copy runs
    compute_fraction: float  # some compute kernel runs
    window_ms: float  # the step windows' summed length (the breakdown's steps)
    steps: int
    # no kernel, copy or collective on the device, per step: the breakdown's data_loading
    # + other (GPU idle, host busy) + idle (GPU idle, host idle), over the same windows
    idle_ms_per_step: float | None
    # a trace without ProfilerStep marks: the time before its first GPU event (CUDA
    # start-up, first copies), left out of the window and of every per-step number
    startup_ms: float | None = None


# NvmlGpu fields written to JSON only when the samples had them (docs/json-schema.md).
_NVML_OPTIONAL = (
    "mem_used_max_gb",
    "mem_total_gb",
    "mem_headroom_fraction",
    "throttled_share",
    "throttle_share_by_reason",
    "throttled_clock_ratio",
)


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU's NVML samples over the training steps (``over="steps"``: from the first
    step's start to the last step's end), else over the whole run (``over="run"``)."""

    node: int
    gpu: int
    samples: int
    over: str = "run"
    util_gpu_mean: float | None = None
    util_mem_mean: float | None = None
    power_w_mean: float | None = None
    temp_c_mean: float | None = None
    sm_clock_mhz_mean: float | None = None
    mem_used_max_gb: float | None = None
    mem_total_gb: float | None = None
    mem_headroom_fraction: float | None = None
    throttled_share: float | None = None
    throttle_share_by_reason: dict[str, float] | None = None
    throttled_clock_ratio: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: v for k, v in out.items() if k not in _NVML_OPTIONAL or v is not None}


@dataclass(frozen=True)
class GpuResult:
    kernel_busy: tuple[KernelBusy, ...] = ()
    nvml: tuple[NvmlGpu, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return whole(self.json_rows())

    def json_rows(self) -> dict[str, Any]:
        """:meth:`to_json` with its per-rank lists as jsonable.Rows (made as written)."""
        return {
            "kernel_busy": rows_of(self.kernel_busy, asdict),
            "nvml": rows_of(self.nvml, NvmlGpu.to_json),
        }


def kernel_busy(trace: Any) -> KernelBusy | None:
    """Fraction of the profiled steps during which some GPU kernel/copy runs; a trace
    without ProfilerStep marks is one step over all its events (as in the breakdown).
    Cached on the trace."""
    busy = trace.cached("kernel_busy", lambda: _kernel_busy(trace))
    return None if busy is None else replace(busy, rank=int(trace.meta.rank))


def _kernel_busy(trace: Any) -> KernelBusy | None:
    ev = trace.events
    gpu = ev[ev["is_gpu"].astype(bool) & ev["kind"].isin(GPU_KINDS)]
    if gpu.empty:
        return None
    # the breakdown's windows: the ProfilerSteps, else the trace from its first GPU event
    windows = step_windows(trace)
    lo = windows["start_ns"].to_numpy(dtype=np.int64)
    hi = windows["end_ns"].to_numpy(dtype=np.int64)
    n_steps = len(windows)
    span = max(int(np.sum(hi - lo)), 1)
    busy_set = iv.union(gpu["start_ns"].to_numpy(), gpu["end_ns"].to_numpy())
    busy = int(iv.per_window_length(busy_set, lo, hi).sum())
    compute = gpu[gpu["kind"] == "compute"]
    compute_set = iv.union(compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy())
    startup = startup_ns(trace)
    return KernelBusy(
        rank=int(trace.meta.rank),
        busy_fraction=float(busy / span),
        compute_fraction=float(iv.per_window_length(compute_set, lo, hi).sum() / span),
        window_ms=span / 1e6,
        steps=n_steps if len(trace.steps) else 0,
        idle_ms_per_step=(span - busy) / 1e6 / n_steps,
        startup_ms=startup / 1e6 if startup > 0 else None,
    )


def _throttle_names(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


# Fewer samples than this inside the training steps: the whole run's are summarised.
MIN_STEP_SAMPLES = 3


def nvml_summary(
    samples: pd.DataFrame | None, steps_window: tuple[int, int] | None = None
) -> list[NvmlGpu]:
    """Per (node, gpu): utilisation, memory headroom, throttle time share by reason, over
    ``steps_window`` (first step start, last step end; epoch ns) where it holds enough
    samples. The whole run's mean includes start-up and exit: an H200 busy 100 % at
    344 W and 1980 MHz during its steps read 2.5 %, 116 W and 1397 MHz (probe 32)."""
    if samples is None or samples.empty or "gpu" not in samples.columns:
        return []
    out = []
    for (node, gpu), every in samples.groupby(["node", "gpu"]):
        g, over = _in_steps(every, steps_window)
        row: dict[str, Any] = {
            "node": int(node),
            "gpu": int(gpu),
            "samples": int(len(g)),
            "over": over,
        }
        for col in ("util_gpu", "util_mem", "power_w", "temp_c", "sm_clock_mhz"):
            if col in g.columns:
                v = pd.to_numeric(g[col], errors="coerce")
                row[f"{col}_mean"] = float(v.mean()) if v.notna().any() else None
        if {"mem_used", "mem_total"} <= set(g.columns):
            used = pd.to_numeric(g["mem_used"], errors="coerce")
            total = pd.to_numeric(g["mem_total"], errors="coerce")
            if used.notna().any() and total.notna().any():
                row["mem_used_max_gb"] = float(used.max() / 1e9)
                row["mem_total_gb"] = float(total.max() / 1e9)
                row["mem_headroom_fraction"] = float(1 - used.max() / total.max())
        reasons = pd.to_numeric(g.get("throttle_reasons"), errors="coerce")
        if reasons is not None and reasons.notna().any():
            bits = reasons.dropna().astype(np.int64)
            row["throttled_share"] = float(((bits & PERF_THROTTLE_MASK) != 0).mean())
            row["throttle_share_by_reason"] = {
                name: float(((bits & bit) != 0).mean())
                for bit, name in THROTTLE_BITS.items()
                if ((bits & bit) != 0).any()
            }
            if "sm_clock_mhz" in g.columns:
                clk = pd.to_numeric(g["sm_clock_mhz"], errors="coerce")
                slow = clk[(reasons & PERF_THROTTLE_MASK).fillna(0).astype(np.int64) != 0]
                if clk.notna().any() and slow.notna().any():
                    row["throttled_clock_ratio"] = float(slow.mean() / clk.max())
        out.append(NvmlGpu(**row))
    return out


def _in_steps(samples: pd.DataFrame, window: tuple[int, int] | None) -> tuple[pd.DataFrame, str]:
    if window is None or "t_ns" not in samples.columns:
        return samples, "run"
    ordered = samples.assign(_t=pd.to_numeric(samples["t_ns"], errors="coerce"))
    ordered = ordered.sort_values("_t")
    t = ordered["_t"].to_numpy()
    inside = (t >= window[0]) & (t <= window[1])
    # the GPU may still run the steps' queued work after the host's last step ended (a
    # loop that never waits for it): the busy samples right after the window count too
    busy = pd.to_numeric(ordered.get("util_gpu"), errors="coerce").fillna(0).to_numpy() > 0
    after = np.flatnonzero(t > window[1])
    if len(after):
        idle = np.flatnonzero(~busy[after])
        tail = after[: idle[0]] if len(idle) else after
        inside[tail] = True
    kept = ordered[inside].drop(columns="_t")
    return (kept, "steps") if len(kept) >= MIN_STEP_SAMPLES else (samples, "run")


def steps_window(steps: pd.DataFrame | None) -> tuple[int, int] | None:
    """(first step's start, last step's end) of a run's steps table, epoch ns."""
    if steps is None or steps.empty or not {"start_ns", "end_ns"} <= set(steps.columns):
        return None
    start = pd.to_numeric(steps["start_ns"], errors="coerce").dropna()
    end = pd.to_numeric(steps["end_ns"], errors="coerce").dropna()
    if start.empty or end.empty:
        return None
    return int(start.min()), int(end.max())


def analyze_gpu(
    traces: list[Any], gpu_samples: pd.DataFrame | None, steps: pd.DataFrame | None = None
) -> GpuResult:
    busy = tuple(b for t in traces if (b := kernel_busy(t)) is not None)
    return GpuResult(kernel_busy=busy, nvml=tuple(nvml_summary(gpu_samples, steps_window(steps))))


def gpu_findings(
    info: GpuResult, step_ms: float, dp_active: bool, ranks: pd.DataFrame | None = None
) -> list[Finding]:
    findings: list[Finding] = []
    findings += _idle_finding(info, step_ms, ranks)
    findings += _throttle_finding(info, step_ms)
    findings += _imbalance_finding(info, step_ms, dp_active)
    return findings


def _busy_share(busy: list[KernelBusy]) -> float:
    """The share of the ranks' profiled windows, summed, in which the GPU is busy: with
    gpu_idle_total (a mean over ranks) it adds up to the step; the mean of the per-rank
    shares (windows of 12.5-18.7 ms) read 42.3 % beside 8.82 of 15.77 ms idle (probe
    31l, F5)."""
    window = sum(b.window_ms for b in busy)
    if window <= 0:
        return float(np.mean([b.busy_fraction for b in busy]))
    return float(sum(b.busy_fraction * b.window_ms for b in busy) / window)


def _idle_finding(info: GpuResult, step_ms: float, ranks: pd.DataFrame | None) -> list[Finding]:
    """GPU traces: the step's time with no kernel, no communication and no data wait:
    the per-rank table's ``other`` (GPU idle, host busy) + ``idle`` (GPU idle, host idle),
    so it never double counts exposed communication or data loading, and its numbers are
    the table's columns. Start-up before a step-less trace's first GPU event is outside
    the window (``startup_ms`` in the evidence), not per-step idle. Without traces: NVML
    utilisation over the run."""
    busy = [b for b in info.kernel_busy if b.idle_ms_per_step is not None]
    if busy and ranks is not None and len(ranks) and {"other", "idle"} <= set(ranks.columns):
        host_busy = float(ranks["other"].astype(float).mean())
        host_idle = float(ranks["idle"].astype(float).mean())
        unexplained = ranks["other"].astype(float) + ranks["idle"].astype(float)
        cost = float(unexplained.mean())
        step = float(ranks["step_ms_mean"].astype(float).mean())
        evidence: dict[str, Any] = {
            "kernel_busy_fraction": round(_busy_share(busy), 3),
            # = host_busy_ms_per_step + host_idle_ms_per_step (the cost)
            "idle_ms_per_step": ms(cost),
            "host_busy_ms_per_step": ms(host_busy),  # the table's `other`
            "host_idle_ms_per_step": ms(host_idle),  # the table's `idle`
            # no GPU work at all, data loading included (the GPU metrics' idle)
            "gpu_idle_total_ms_per_step": ms(
                float(np.mean([b.idle_ms_per_step or 0.0 for b in busy]))
            ),
            "step_ms": ms(step),
            "source": "trace GPU streams (idle not explained by communication or data loading)",
        }
        startup = {b.rank: b.startup_ms for b in busy if b.startup_ms is not None}
        if startup:
            evidence["startup_ms"] = {str(r): ms(v) for r, v in sorted(startup.items())}
        first_startup = max(startup.values(), default=None)
        per_rank = zip(ranks["rank"], unexplained, ranks["step_ms_mean"], strict=False)
        hit = sorted(int(r) for r, u, s in per_rank if severity_for(u, s))
        if not any(b.steps for b in busy):
            evidence["window"] = (
                "the trace from its first GPU event as one step (no ProfilerStep marks)"
            )
    else:
        util = [n.util_gpu_mean for n in info.nvml if n.util_gpu_mean is not None]
        if not util or not (step_ms > 0):
            return []
        step = step_ms
        cost = step_ms * (1 - float(np.mean(util)) / 100)
        evidence = {
            "nvml_util_mean_percent": round(float(np.mean(util)), 1),
            "idle_ms_per_step": ms(cost),
            "step_ms": ms(step),
            "source": "NVML utilisation over the run",
        }
        hit = []
        first_startup = None
    window_cost, window_step = cost, step
    if "host_busy_ms_per_step" in evidence and "window" not in evidence and 0 < step_ms < step:
        # The profiler slows the window's host side: the idle share of the window, of the
        # steady step, is what the fix can give back (never more than the step).
        cost, step = cost * step_ms / step, step_ms
        evidence["steady_step_ms"] = ms(step_ms)
        evidence["window_step_ms"] = evidence.pop("step_ms")
        evidence["window_idle_ms_per_step"] = evidence.pop("idle_ms_per_step")
        evidence["idle_ms_per_step"] = ms(cost)
    severity = severity_for(cost, step)
    if severity is None:
        return []
    share = f"{pct_text(100 * cost / step)}"
    if "window_step_ms" in evidence:
        title = (
            f"GPU idle {ms_text(cost)} ms per step ({share} of the steady "
            f"{ms_text(step)} ms step; profiled window {ms_text(window_cost)} of "
            f"{ms_text(window_step)} ms: host busy "
            f"{ms_text(evidence['host_busy_ms_per_step'])} ms, host idle "
            f"{ms_text(evidence['host_idle_ms_per_step'])} ms)"
        )
    elif "host_busy_ms_per_step" in evidence:
        split = (
            f"host busy {ms_text(evidence['host_busy_ms_per_step'])} ms, "
            f"host idle {ms_text(evidence['host_idle_ms_per_step'])} ms"
        )
        if "window" in evidence:
            title = (
                f"GPU idle {ms_text(cost)} ms of the {ms_text(step)} ms traced ({share}: {split}"
            )
            title += "; no ProfilerStep marks"
            if first_startup is not None:
                title += f"; {ms_text(first_startup)} ms of start-up before the first GPU event not counted"
            title += ")"
        else:
            title = f"GPU idle {ms_text(cost)} ms per step ({share} of the step: {split})"
    else:
        title = f"GPU idle {ms_text(cost)} ms per step ({share} of the step)"
    return [
        Finding(
            kind="gpu_idle",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=hit,
            title=title,
            evidence=evidence,
            fix=GPU_IDLE_FIX,
        )
    ]


def _throttle_finding(info: GpuResult, step_ms: float) -> list[Finding]:
    rows = [n for n in info.nvml if (n.throttled_share or 0.0) > 0.05]
    if not rows:
        return []
    worst = max(rows, key=lambda n: n.throttled_share or 0.0)
    share = worst.throttled_share or 0.0
    ratio = worst.throttled_clock_ratio
    slowdown = 1 - (ratio if ratio is not None else 0.9)
    cost = step_ms * share * max(slowdown, 0.0) if step_ms > 0 else 0.0
    severity = severity_for(cost, step_ms) or "low"
    return [
        Finding(
            kind="gpu_throttled",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=[],
            title=(
                f"GPU {worst.gpu} (node {worst.node}) throttled {pct_text(100 * share)} of the run"
            ),
            evidence={
                "gpus": [
                    {
                        "node": n.node,
                        "gpu": n.gpu,
                        "throttled_share": round(n.throttled_share or 0.0, 3),
                        "by_reason": n.throttle_share_by_reason or {},
                    }
                    for n in rows
                ],
                "clock_ratio_when_throttled": ratio,
            },
            fix=THROTTLE_FIX,
        )
    ]


def _imbalance_finding(info: GpuResult, step_ms: float, dp_active: bool) -> list[Finding]:
    nvml = [n for n in info.nvml if n.util_gpu_mean is not None]
    findings = []
    for node in sorted({n.node for n in nvml}):
        gpus = sorted((n for n in nvml if n.node == node), key=lambda n: n.gpu)
        if len(gpus) < 2 or gpus[0].gpu != 0:
            continue
        g0, others = gpus[0], gpus[1:]
        util0 = float(g0.util_gpu_mean or 0.0)
        util_others = float(np.mean([n.util_gpu_mean for n in others]))
        mem0 = g0.mem_used_max_gb
        mem_others = [n.mem_used_max_gb for n in others if n.mem_used_max_gb is not None]
        mem_ratio = (
            mem0 / float(np.mean(mem_others))
            if mem0 and mem_others and np.mean(mem_others) > 0
            else None
        )
        util_gap = util0 - util_others
        if util_gap < 10 and (mem_ratio is None or mem_ratio < 1.2):
            continue
        # Time the other GPUs sit idle while GPU0 still works.
        cost = step_ms * max(util_gap, 0.0) / 100 if step_ms > 0 else 0.0
        severity = severity_for(cost, step_ms) or "low"
        findings.append(
            Finding(
                kind="gpu0_imbalance",
                severity=severity,
                cost_ms_per_step=cost,
                ranks=[],
                title=(
                    f"GPU0 on node {node} works harder than the others "
                    f"(util {pct_text(util0)} vs {pct_text(util_others)}"
                    + (f", memory x{mem_ratio:.2f}" if mem_ratio else "")
                    + ")"
                ),
                evidence={
                    "node": node,
                    "gpu0_util_percent": round(util0, 1),
                    "others_util_percent": round(util_others, 1),
                    "gpu0_mem_gb": mem0,
                    "others_mem_gb_mean": float(np.mean(mem_others)) if mem_others else None,
                    "gpu0_mem_ratio": round(mem_ratio, 3) if mem_ratio else None,
                    "dataparallel": dp_active,
                },
                fix=IMBALANCE_FIX,
            )
        )
    return findings


# --------------------------------------------------------------------------- no_amp

_GEMM_RE = re.compile(r"gemm|gemv|xmma|cutlass|matmul", re.IGNORECASE)
_FP32_RE = re.compile(
    r"sgemm|f32f32|fp32|float, float|<float,|_f32_|gemv2t_kernel_val<int, int, float", re.IGNORECASE
)
_HALF_RE = re.compile(r"f16|bf16|h884|h1688|s1688|16816|hgemm|half|tf32|fp8|e4m3", re.IGNORECASE)
NO_AMP_FIX_FP16 = (
    "Matrix multiplies run in fp32 on a GPU without bf16 or TF32 (compute capability "
    "below 8.0, e.g. V100, T4): wrap forward and loss in torch.autocast('cuda', "
    "dtype=torch.float16) and scale the loss with torch.amp.GradScaler('cuda') "
    "(fp16 tensor cores)."
)
# name fragments of GPUs before Ampere (no bf16, no TF32), for traces without computeMajor
_PRE_AMPERE_RE = re.compile(
    r"V100|P100|P40|P4\b|T4\b|K80|K40|M60|M40|Titan V|Titan Xp|Quadro RTX|RTX 20\d\d|"
    r"GTX|Tesla [KMP]\d",
    re.IGNORECASE,
)
NO_AMP_FIX = (
    "Matrix multiplies run in fp32: wrap forward and loss in "
    "torch.autocast('cuda', dtype=torch.bfloat16) (with torch.amp.GradScaler for "
    "float16), or at least enable TF32 (torch.backends.cuda.matmul.allow_tf32 = True / "
    "torch.set_float32_matmul_precision('high'))."
)


def _own_name(names: pd.Series) -> pd.Series:
    """Only the kernel's own name and template arguments, not its parameter list."""
    return names.str.split("(", n=1).str[0]


def _is_fp32(names: pd.Series) -> pd.Series:
    own = _own_name(names)
    return own.str.contains(_FP32_RE) & ~own.str.contains(_HALF_RE)


def gemm_precision(trace: Any) -> dict[str, Any] | None:
    """GEMM time per step and its fp32 share (cached on the trace)."""
    row = trace.cached("gemm_precision", lambda: _gemm_precision(trace))
    return None if row is None else {**row, "rank": int(trace.meta.rank)}


def _gemm_precision(trace: Any) -> dict[str, Any] | None:
    ev = trace.events
    kern = ev[ev["is_gpu"].astype(bool) & (ev["kind"] == "compute")]
    if kern.empty:
        return None
    is_gemm = name_mask(kern["name"], lambda s: _own_name(s).str.contains(_GEMM_RE))
    gemm = kern[is_gemm]
    if gemm.empty:
        return None
    n_steps = int(len(trace.steps)) if trace.steps is not None and len(trace.steps) else 1
    if trace.steps is not None and len(trace.steps):
        # the profiled steps' own kernels: a host that ran ahead leaves other steps' in
        # the trace (an H200 job: 6.2 steps of kernels for 5 steps, "17.15 ms per step of
        # fp32 GEMM" in a 14.0 ms step)
        starts = gemm["start_ns"].to_numpy(dtype=np.int64)
        gemm = gemm[_window_of(starts, step_windows(trace)) >= 0]
    fp32 = gemm[name_mask(gemm["name"], _is_fp32)]
    return {
        "rank": int(trace.meta.rank),
        "gemm_ms_per_step": float(gemm["dur_ns"].sum() / 1e6 / n_steps),
        "fp32_gemm_ms_per_step": float(fp32["dur_ns"].sum() / 1e6 / n_steps),
        "fp32_kernels": sorted(fp32["name"].astype(str).unique().tolist())[:5],
    }


def compute_capability(trace: Any) -> tuple[str | None, float | None]:
    """(device name, compute capability) of the trace's first listed GPU: capability from
    deviceProperties' computeMajor/Minor, else 7.0 for a pre-Ampere name, else None."""
    devices = getattr(trace.meta, "device_properties", None) or []
    if not devices:
        return None, None
    dev = devices[0]
    name = str(dev.get("name")) if dev.get("name") else None
    major, minor = dev.get("computeMajor"), dev.get("computeMinor", 0)
    if isinstance(major, int) and not isinstance(major, bool) and major > 0:
        minor = minor if isinstance(minor, int) and 0 <= minor < 10 else 0
        return name, major + minor / 10
    if name and _PRE_AMPERE_RE.search(name):
        return name, 7.0
    return name, None


def no_amp_findings(traces: list[Any], step_ms: float) -> list[Finding]:
    rows = [g for t in traces if (g := gemm_precision(t)) is not None]
    rows = [g for g in rows if g["fp32_gemm_ms_per_step"] > 0.5 * g["gemm_ms_per_step"] > 0]
    if not rows:
        return []
    by_rank = {int(t.meta.rank): t for t in traces}
    device, capability = compute_capability(by_rank[rows[0]["rank"]])
    is_amd = device is not None and any(k in device for k in ("AMD", "Instinct", "Radeon"))
    if capability is not None and capability < 7.0 and not is_amd:
        return []  # no tensor cores: mixed precision is no sure gain, say nothing
    pre_ampere = capability is not None and capability < 8.0 and not is_amd
    fp32_ms = float(np.mean([g["fp32_gemm_ms_per_step"] for g in rows]))
    # Assumption: bf16/fp16 tensor-core GEMMs run at least 2x faster than fp32 ones.
    cost = fp32_ms / 2
    severity = severity_for(cost, step_ms)
    if severity is None:
        return []
    return [
        Finding(
            kind="no_amp",
            severity=severity,
            cost_ms_per_step=cost,
            ranks=sorted(g["rank"] for g in rows),
            title=f"{ms_text(fp32_ms)} ms per step of fp32 matrix multiplies (no mixed precision)",
            evidence={
                "fp32_gemm_ms_per_step": ms(fp32_ms),
                "gemm_ms_per_step": ms(float(np.mean([g["gemm_ms_per_step"] for g in rows]))),
                "example_kernels": rows[0]["fp32_kernels"],
                "device": device,
                "compute_capability": capability,
                "estimate": "half of the fp32 GEMM time ("
                + ("fp16" if pre_ampere else "bf16")
                + " tensor cores >= 2x faster)",
            },
            fix=NO_AMP_FIX_FP16 if pre_ampere else NO_AMP_FIX,
        )
    ]
