"""``gpudiag bench``: single vs DataParallel vs DDP, and a batch-size sweep, on this machine.

Every configuration runs under capture (``python -m gpudiag trace --out <out>/<name>
... -m gpudiag.reference ...``); the numbers are read back from the run directories.
Writes bench.md, bench.csv and bench.json into ``--out`` and bench.json into every run
directory (so the dashboard's Compare view can show the table next to any of them).

Definitions (per-device batch held fixed, so DDP on N ranks does N x the work per step):
- samples/s: global batch / median step time (steps after the first two, every rank);
- speed-up: samples/s over single-device samples/s at the same per-device batch;
- scaling efficiency: speed-up / number of devices;
- comm share: communication time per step / step time (overlapped + exposed, from the
  analysed profiler window; DDP's own averages when the analysis is unavailable);
- DP overhead share: scatter + replicate + gather per step / step time (DataParallel only);
- peak memory per device: NVML's used memory on GPU; the trainer's peak (CUDA max
  allocated, or the rank process's max RSS on CPU) otherwise.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpudiag import rundir

PREFIX = "gpudiag bench"
BENCH_FILE = rundir.BENCH  # also written into each run directory
WARMUP_STEPS = 2
MODES_ORDER = ("single", "dp", "ddp")


class BenchError(Exception):
    """A usage problem, reported as one line (exit status 2)."""


@dataclass
class BenchRun:
    """One configuration: how it was run and what it measured."""

    name: str
    mode: str
    batch_per_device: int
    devices: int
    command: list[str]
    status: str = "not run"
    wall_s: float = 0.0
    global_batch: int | None = None
    steps_measured: int = 0
    median_step_ms: float | None = None
    samples_per_s: float | None = None
    speedup: float | None = None
    scaling_efficiency: float | None = None
    comm_share: float | None = None
    exposed_comm_share: float | None = None
    dp_overhead_share: float | None = None
    peak_mem_per_device_mib: float | None = None
    peak_mem_kind: str | None = None
    final_loss: float | None = None
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- arguments


def _parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"--batch-sizes {text!r}: expected integers like 32,128") from None
    if not sizes or min(sizes) < 1:
        raise BenchError(f"--batch-sizes {text!r}: need at least one size >= 1")
    return sizes


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --------------------------------------------------------------------------- planning


def plan_runs(args: argparse.Namespace, out: Path, cuda_devices: int) -> list[BenchRun]:
    """single, dp (CUDA only) and ddp at every batch size, in that order."""
    from gpudiag.reference.models import WORKLOADS

    if args.model not in WORKLOADS:
        raise BenchError(f"--model {args.model!r}: choose one of {', '.join(sorted(WORKLOADS))}")
    if args.steps <= WARMUP_STEPS:
        raise BenchError(f"--steps must be more than {WARMUP_STEPS} (the warm-up steps skipped)")
    device = args.device or ("cuda" if cuda_devices else "cpu")
    if device == "cuda" and not cuda_devices:
        raise BenchError("--device cuda, but torch sees no CUDA device on this machine")
    nproc = args.nproc_per_node or (cuda_devices if device == "cuda" else 2)
    if nproc < 1:
        raise BenchError("--nproc-per-node must be at least 1")
    runs = []
    for batch in _parse_batch_sizes(args.batch_sizes):
        modes = [("single", 1)]
        if device == "cuda":
            modes.append(("dp", cuda_devices))
        modes.append(("ddp", nproc))
        for mode, devices in modes:
            name = f"{mode}-bs{batch}"
            trainer = [
                "--mode",
                mode,
                "--model",
                args.model,
                "--steps",
                str(args.steps),
                "--batch-size",
                str(batch),
                "--device",
                device,
                "--quiet",
                "--report-dir",
                str(out / "reports" / name),
                "--dataset-size",
                str(max(4096, batch * devices)),
            ]
            runs.append(
                BenchRun(
                    name,
                    mode,
                    batch,
                    devices,
                    trace_command(out / name, mode, devices, trainer, args),
                )
            )
    return runs


def trace_command(
    run_dir: Path, mode: str, devices: int, trainer: list[str], args: argparse.Namespace
) -> list[str]:
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--out", str(run_dir)]
    if args.profile_steps:
        cmd += ["--profile-steps", args.profile_steps]
    if mode == "ddp":
        from gpudiag.reference.train import free_port

        cmd += ["--nproc-per-node", str(devices), "--master-port", str(free_port())]
    return [*cmd, "-m", "gpudiag.reference", *trainer]


# --------------------------------------------------------------------------- measuring


def step_stats(steps: Any) -> tuple[float | None, int]:
    """Median step time (ms) over every rank's steps after the warm-up, and how many."""
    if steps is None or len(steps) == 0:
        return None, 0
    measured = steps[steps["step"] >= WARMUP_STEPS]
    if len(measured) == 0:
        measured = steps
    durations = (measured["end_ns"] - measured["start_ns"]) / 1e6
    return float(durations.median()), int(measured["step"].nunique())


def _analysis_shares(run_dir: Path, notes: list[str]) -> dict[str, float | None]:
    """Communication and DP overhead shares from gpudiag's analysis of the profiled
    window, when that analysis is installed and succeeds."""
    shares: dict[str, float | None] = {"comm": None, "exposed": None, "dp": None}
    try:
        from gpudiag.analysis import analyze

        result = analyze(run_dir)
    except Exception as exc:  # the analysis is optional here; say why it is missing
        notes.append(f"analysis unavailable ({type(exc).__name__}: {str(exc)[:100]})")
        return shares
    ranks = result.ranks
    if len(ranks) and {"comm_overlapped", "comm_exposed", "step_ms_mean"} <= set(ranks.columns):
        step_ms = ranks["step_ms_mean"].astype(float)
        comm = ranks["comm_overlapped"].astype(float) + ranks["comm_exposed"].astype(float)
        shares["comm"] = _finite((comm / step_ms).mean())
        shares["exposed"] = _finite((ranks["comm_exposed"].astype(float) / step_ms).mean())
    dp = result.dataparallel
    if dp is not None and not dp.on_cpu and result.step_ms > 0:
        shares["dp"] = _finite(dp.overhead_ms_per_step / result.step_ms)
    return shares


def _ddp_stats_comm_share(ddp_stats: Any, median_step_ms: float | None) -> float | None:
    """DDP's own backward communication time (sampled iterations) over the step time."""
    if median_step_ms is None or len(ddp_stats) == 0:
        return None
    if "backward_comm_time" not in ddp_stats.columns:
        return None
    comm_ns = ddp_stats["backward_comm_time"].dropna()
    return _finite(float(comm_ns.median()) / 1e6 / median_step_ms) if len(comm_ns) else None


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _reports(report_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(report_dir.glob("rank*.json")):
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _peak_memory(run: rundir.Run, reports: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    gpu = run.gpu_samples
    if len(gpu) and gpu["mem_used"].notna().any():
        return float(gpu.groupby("gpu")["mem_used"].max().max()) / 2**20, "nvml_mem_used"
    peaks = [r["peak_memory_bytes"] for r in reports if r.get("peak_memory_bytes")]
    if peaks:
        return max(peaks) / 2**20, str(reports[0].get("peak_memory_kind"))
    return None, None


def measure(run: BenchRun, run_dir: Path, report_dir: Path) -> None:
    """Fill the run's numbers from its run directory (and the trainer's own reports)."""
    loaded = rundir.load_run(run_dir)
    run.notes += loaded.warnings[:3]
    devices = (loaded.world_size or run.devices) if run.mode == "ddp" else run.devices
    run.global_batch = run.batch_per_device * devices
    run.median_step_ms, run.steps_measured = step_stats(loaded.steps)
    if run.median_step_ms:
        run.samples_per_s = run.global_batch / (run.median_step_ms / 1e3)
    shares = _analysis_shares(run_dir, run.notes)
    run.comm_share, run.exposed_comm_share, run.dp_overhead_share = (
        shares["comm"],
        shares["exposed"],
        shares["dp"],
    )
    if run.comm_share is None and run.mode == "ddp":
        run.comm_share = _ddp_stats_comm_share(loaded.ddp_stats, run.median_step_ms)
    if run.mode == "single":
        run.comm_share = run.comm_share or 0.0
    reports = _reports(report_dir)
    run.peak_mem_per_device_mib, run.peak_mem_kind = _peak_memory(loaded, reports)
    losses = [r["final_loss"] for r in reports if r.get("final_loss") is not None]
    run.final_loss = losses[0] if losses else None


def fill_speedups(runs: list[BenchRun]) -> None:
    single = {r.batch_per_device: r.samples_per_s for r in runs if r.mode == "single"}
    for r in runs:
        base = single.get(r.batch_per_device)
        if r.samples_per_s and base:
            r.speedup = r.samples_per_s / base
            r.scaling_efficiency = r.speedup / r.devices


# --------------------------------------------------------------------------- running


def run_env(device: str) -> dict[str, str]:
    """The environment of every run. On CPU one device is one core: the single-device run
    gets one intra-op thread like each torchrun rank (torchrun sets OMP_NUM_THREADS=1),
    else it competes with itself and the comparison means nothing."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def execute(run: BenchRun, out: Path, timeout_s: float, env: dict[str, str]) -> None:
    log_path = out / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(
                run.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout_s,
                check=False,
            )
            run.status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            run.status = f"failed (timeout {timeout_s:.0f} s)"
    run.wall_s = time.perf_counter() - started
    if not rundir.is_run_dir(out / run.name):
        run.notes.append(f"no run directory written; see {log_path}")
        if run.status == "ok":
            run.status = "failed (no run directory)"
        return
    measure(run, out / run.name, out / "reports" / run.name)


# --------------------------------------------------------------------------- output


COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "run"),
    ("mode", "mode"),
    ("devices", "devices"),
    ("batch_per_device", "batch/device"),
    ("global_batch", "global batch"),
    ("samples_per_s", "samples/s"),
    ("median_step_ms", "median step ms"),
    ("speedup", "speed-up vs single"),
    ("scaling_efficiency", "scaling eff."),
    ("comm_share", "comm share"),
    ("exposed_comm_share", "exposed comm"),
    ("dp_overhead_share", "DP overhead"),
    ("peak_mem_per_device_mib", "peak MiB/device"),
    ("final_loss", "final loss"),
    ("status", "status"),
)
PERCENT = {"scaling_efficiency", "comm_share", "exposed_comm_share", "dp_overhead_share"}


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if key in PERCENT:
        return f"{100 * value:.0f}%"
    if key == "speedup":
        return f"{value:.2f}x"
    if key == "final_loss":
        return f"{value:.4f}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def markdown_table(runs: list[BenchRun]) -> str:
    header = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = ["| " + " | ".join(_cell(k, getattr(r, k)) for k, _ in COLUMNS) + " |" for r in runs]
    return "\n".join([header, rule, *rows])


def bench_document(runs: list[BenchRun], meta: dict[str, Any]) -> dict[str, Any]:
    return {"format_version": 1, "kind": "gpudiag_bench", **meta, "runs": [asdict(r) for r in runs]}


def write_outputs(out: Path, runs: list[BenchRun], meta: dict[str, Any]) -> str:
    table = markdown_table(runs)
    notes = [f"- {r.name}: {n}" for r in runs for n in r.notes]
    md = [
        f"# gpudiag bench: {meta['model']} on {meta['device']}",
        "",
        f"Recorded {meta['recorded_at']} on {meta['host']} ({meta['torch']}); "
        f"{meta['steps']} steps per run, per-device batch held fixed. "
        "samples/s = global batch / median step (warm-up steps skipped). "
        f"OMP_NUM_THREADS={meta['omp_num_threads']} per process; 1-minute load average "
        f"{meta['load_average_1min'][0]} before, {meta['load_average_1min'][1]} after "
        "(other work on the machine skews the numbers).",
        "",
        table,
        "",
    ]
    if notes:
        md += ["Notes:", *notes, ""]
    (out / "bench.md").write_text("\n".join(md), encoding="utf-8")
    with open(out / "bench.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([k for k, _ in COLUMNS] + ["wall_s", "run_dir"])
        for r in runs:
            writer.writerow([getattr(r, k) for k, _ in COLUMNS] + [round(r.wall_s, 2), r.name])
    document = bench_document(runs, meta)
    rundir.write_json_atomic(out / BENCH_FILE, document)
    for r in runs:
        if rundir.is_run_dir(out / r.name):
            rundir.write_json_atomic(out / r.name / BENCH_FILE, {**document, "this_run": r.name})
    return table


def _meta(args: argparse.Namespace, device: str, env: dict[str, str]) -> dict[str, Any]:
    import platform

    import torch

    return {
        "model": args.model,
        "device": device,
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "steps": args.steps,
        "recorded_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": f"{platform.node()}, {os.cpu_count()} CPU cores",
        "torch": f"torch {torch.__version__}",
        "warmup_steps_skipped": WARMUP_STEPS,
    }


def run_bench(args: argparse.Namespace) -> int:
    """Plan, run and tabulate the comparison (options parsed by gpudiag/cli/bench.py).
    Exit code: 0 every run ok, 1 a run failed, 2 bad options."""
    out = args.out or Path("gpudiag_runs") / datetime.now().strftime("bench-%Y%m%d-%H%M%S")
    try:
        runs = plan_runs(args, out, _cuda_device_count())
        taken = [r.name for r in runs if (out / r.name).exists()]
        if taken:
            raise BenchError(f"{out}: already holds {', '.join(taken)}; choose a new --out")
    except BenchError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    device = runs[0].command[runs[0].command.index("--device") + 1]
    env = run_env(device)
    load_before = os.getloadavg()[0]
    print(f"{PREFIX}: {len(runs)} runs under capture into {out}", flush=True)
    for i, run in enumerate(runs, 1):
        print(
            f"[{i}/{len(runs)}] {run.name}: {run.devices} device(s), batch {run.batch_per_device}"
            "/device ...",
            end=" ",
            flush=True,
        )
        execute(run, out, args.run_timeout, env)
        speed = f"{run.samples_per_s:,.0f} samples/s" if run.samples_per_s else "no numbers"
        print(f"{run.status} in {run.wall_s:.1f} s, {speed}", flush=True)
    fill_speedups(runs)
    meta = _meta(args, device, env)
    meta["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    table = write_outputs(out, runs, meta)
    print()
    print(table)
    print(
        f"\n{PREFIX}: wrote {out / 'bench.md'}, bench.csv, bench.json (and bench.json in "
        "each run directory)"
    )
    if args.device != "cuda" and not any(r.mode == "dp" for r in runs):
        print(f"{PREFIX}: no DataParallel rows: nn.DataParallel needs CUDA devices")
    return 0 if all(r.status == "ok" for r in runs) else 1
