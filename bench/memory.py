"""Benchmark: peak memory of `gpudiag analyze` on one large trace and on a trace set.

The large trace is SYNTHETIC: the events of one real recorded trace
(../shared/traces/astrasim_megatron_tp8/megatron_kineto_0.json.gz, 14,245 events)
replicated end to end (each copy shifted by the trace's span, its ProfilerStep renumbered)
until it holds N events. It is written to a scratch directory, never into the repo, and
is not a recording: it only measures how memory scales with the number of events.

    python bench/memory.py [--events 1000000 10000000] [--shape large|small|both]
        [--scratch DIR] [--code REPO] [--set ../shared/traces/astrasim_megatron_tp8] [--repeat 3]

--shape small (make_small_trace) writes the same events in a compact form, ~100 bytes each,
every one a complete event (a table row): the issue's case of a 10M-event trace of ~820 MB,
where the table's cost per event rather than the JSON's size sets the peak. Also SYNTHETIC.

Each case runs `python -m gpudiag analyze PATH --json` in a subprocess (imports
included, like a user sees it); the peak is the sum of the peak RSS of the process and of
each of its workers (the kernel's VmHWM, read every 20 ms, and wait4's maxrss for the main
process; shared pages count once per process, so an upper bound). --code runs
another checkout's gpudiag (for before/after). Cases under 5M events run --repeat times
(median and range printed); larger ones once. Goal (issue 16 item 10): peak <= 3x the
uncompressed trace, and <= 2 GB for 10 million events; issue 28: <= 1.6 GB for 10 million
small events (measured 1,268 MiB, docs/reliability.md). A single trace loads in the analyze
process itself, so the sum is that one process's peak there.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
SOURCE = SHARED / "astrasim_megatron_tp8" / "megatron_kineto_0.json.gz"


def make_replicated_trace(events: int, out: Path) -> Path:
    """SYNTHETIC trace of ``events`` events replicated from SOURCE (see module doc)."""
    path = out / f"replicated_{events}.pt.trace.json"
    if path.is_file():
        return path
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    source = doc.pop("traceEvents")
    timed = [e for e in source if isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = hi - lo + 1000
    doc["traceName"] = f"SYNTHETIC: {SOURCE.name} replicated to {events} events"

    def shifted(e: dict, copy: int) -> dict:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + copy * span
        if e.get("name") == "ProfilerStep#3":
            e["name"] = f"ProfilerStep#{3 + copy}"
        if isinstance(e.get("id"), int):  # flow ids stay unique per copy
            e["id"] = e["id"] + copy * 10**7
        return e

    return _write_copies(doc, source, events, path, shifted)


def _write_copies(
    doc: dict, source: list[dict], events: int, path: Path, shifted: Callable[[dict, int], dict]
) -> Path:
    """Write ``doc`` with ``events`` trace events: copies of ``source``, each event of copy
    k passed through ``shifted(event, k)`` (a fresh dict), streamed in batches."""
    tmp = path.with_suffix(".tmp")
    written = 0
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(doc)[:-1] + b',"traceEvents":[')
        copy = 0
        while written < events:
            batch = [shifted(dict(e), copy) for e in source[: events - written]]
            if written:
                fh.write(b",")
            fh.write(orjson.dumps(batch)[1:-1])
            written += len(batch)
            copy += 1
        fh.write(b"]}")
    tmp.rename(path)
    return path


_SMALL_ARGS = {  # the args each category keeps in the small shape (the rest are dropped)
    "kernel": ("stream", "correlation"),
    "gpu_memcpy": ("stream", "correlation"),
    "gpu_memset": ("stream", "correlation"),
}
_LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cuLaunchKernel",
)  # the runtime calls that keep their correlation id
_COMM_ARGS = ("Input type", "Input Dims")  # kept on the collective's CPU events


def _short_name(name: str, cat: object) -> str:
    """A short name of the same kind: a kernel's template and argument lists cut off, then
    at most 16 characters, except that NCCL kernels keep their op and dtype and GEMM
    kernels the word "gemm" (what gpudiag reads from kernel names)."""
    if cat == "kernel":  # cut the signature off
        name = name.removeprefix("void ").split("<", 1)[0].rsplit("::", 1)[-1]
        name = name.split("(", 1)[0] or "kernel"
    if "nccl" in name:
        return name
    if "gemm" in name:
        return name[: name.index("gemm") + 4]
    return name[:16]


def _small_event(e: dict, lo: float) -> dict | None:
    """One complete event of SOURCE in the small shape; None for the others."""
    if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)):
        return None
    cat, name = e.get("cat"), str(e.get("name"))
    small = {"ph": "X", "cat": cat, "name": _short_name(name, cat)}
    small["pid"] = 1 if e.get("pid") not in (0, "0") else 0  # 1 = host, 0 = GPU
    tid = e.get("tid")
    small["tid"] = tid if small["pid"] == 0 else (1 if tid == e.get("pid") else 2)
    small["ts"] = e["ts"] - lo
    small["dur"] = e.get("dur", 0)
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    keep = _SMALL_ARGS.get(str(cat), ())
    if name in _LAUNCHES:
        keep = ("correlation",)
    if "comm" in name or "nccl" in name or "c10d" in name:
        keep = keep + _COMM_ARGS
    kept = {k: args[k] for k in keep if k in args}
    if kept:
        small["args"] = kept
    return small


def make_small_trace(events: int, out: Path) -> Path:
    """SYNTHETIC trace of ``events`` small events (~80 bytes each): SOURCE's complete
    events (cpu_op, cuda_runtime, kernel, ProfilerStep...) in a compact shape (short names,
    host pid/tid 1, relative timestamps, only the args gpudiag reads), replicated like
    make_replicated_trace. Every event is a complete event, so every one is a table row
    (the costliest case per byte of JSON). Not a recording."""
    path = out / f"small_{events}.pt.trace.json"
    if path.is_file():
        return path
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    timed = [e for e in doc.pop("traceEvents") if isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = hi - lo + 1000
    source = [s for s in (_small_event(e, lo) for e in timed) if s is not None]
    source = [e for e in source if e["cat"] != "Trace"]  # the profiler's own span
    source.sort(key=lambda e: e["ts"])
    doc.pop("deviceProperties", None)
    doc["baseTimeNanoseconds"] = int(lo) * 1000
    doc["traceName"] = f"SYNTHETIC: {SOURCE.name} small events replicated to {events} events"

    def shifted(e: dict, copy: int) -> dict:
        e["ts"] = e["ts"] + copy * span
        if e["name"] == "ProfilerStep#3":
            e["name"] = f"ProfilerStep#{3 + copy}"
        if "args" in e and "correlation" in e["args"]:
            e["args"] = dict(e["args"], correlation=e["args"]["correlation"] + copy * 10**5)
        return e

    return _write_copies(doc, source, events, path, shifted)


def _hwm(pid: int) -> int:
    """The process's own peak RSS so far (VmHWM), in bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_of(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; the sum of the peak RSS of it and of each of its workers, and its time.

    Each process's own high-water mark (the kernel's VmHWM, read every 20 ms while it
    lives; wait4's ru_maxrss for the main process), so short spikes are not missed; the
    sum is an upper bound of the simultaneous total (and counts shared pages per process)."""
    t0 = time.perf_counter()
    proc = psutil.Popen(
        cmd,
        env=env,
        cwd=env["PYTHONPATH"],  # `python -m` puts the working directory first on sys.path
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    peaks: dict[int, int] = {}
    while True:
        done, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if done:
            break
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            children = []
        for pid in [proc.pid, *(c.pid for c in children)]:
            peaks[pid] = max(peaks.get(pid, 0), _hwm(pid))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    peaks[proc.pid] = max(peaks.get(proc.pid, 0), usage.ru_maxrss * 1024)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    total = sum(peaks.values())
    return {"peak_mib": total / 2**20, "wall_s": wall, "rc": proc.returncode, "stderr": err}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "gpudiag-bench")
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose gpudiag runs")
    ap.add_argument("--set", type=Path, nargs="*", default=[SHARED / "astrasim_megatron_tp8"])
    ap.add_argument(
        "--shape",
        choices=("large", "small", "both"),
        default="both",
        help="SYNTHETIC event shape: large = the recorded events as they are (~208 B each), "
        "small = make_small_trace's compact complete events (~100 B each)",
    )
    ap.add_argument("--workers", default=None, help="pass --workers N to analyze")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case under 5M events")
    args = ap.parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(args.code), GPUDIAG_MAX_TRACE_BYTES=str(8 << 30))
    extra = ["--workers", args.workers] if args.workers else []
    print(f"code: {args.code}; peak = sum of the peak RSS (VmHWM) of analyze and its workers")
    print(
        "SYNTHETIC = the events of a recorded per-rank trace "
        f"({SOURCE.parent.name}/{SOURCE.name}) replicated to N events: not a recording"
    )
    print(f"{'input':<58} {'JSON MB':>8} {'peak MiB (range)':>20} {'x JSON':>7} {'time s':>7}")
    cases: list[tuple[str, Path, int, int]] = []
    makers = {"large": make_replicated_trace, "small": make_small_trace}
    shapes = ("large", "small") if args.shape == "both" else (args.shape,)
    for shape in shapes:
        for n in args.events:
            path = makers[shape](n, args.scratch)
            label = f"SYNTHETIC {n:,} {shape} events (replicated real trace)"
            cases.append((label, path, path.stat().st_size, args.repeat if n < 5_000_000 else 1))
    for d in args.set:
        size = sum(len(gzip.decompress(p.read_bytes())) for p in d.glob("*.json.gz"))
        size += sum(p.stat().st_size for p in d.glob("*.json"))
        cases.append((f"recorded set {d.name}", d, size, args.repeat))
    for label, path, size, repeat in cases:
        cmd = [sys.executable, "-m", "gpudiag", "analyze", str(path), "--json", *extra]
        runs = [peak_of(cmd, env) for _ in range(repeat)]
        peaks = sorted(r["peak_mib"] for r in runs)
        walls = sorted(r["wall_s"] for r in runs)
        bad = [r for r in runs if r["rc"] != 0]
        status = f"  rc={bad[0]['rc']}: {bad[0]['stderr'].strip()[-200:]}" if bad else ""
        peak = statistics.median(peaks)
        spread = f"{peak:.0f} ({peaks[0]:.0f}-{peaks[-1]:.0f})"
        print(
            f"{label:<58} {size / 1e6:>8.0f} {spread:>20} "
            f"{peak * 2**20 / size:>7.2f} {statistics.median(walls):>7.1f}{status}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
