"""Benchmark: gpudiag's ingest + core analysis vs HTA vs the gzip + orjson floor.

Each contender runs in its own subprocess (so peak RSS is its own); imports happen
before the clock starts. Prints a side-by-side table with ratios.

    python bench/analysis.py [TRACE_DIR] [--repeat N] [--workers N]

Default trace set: ../shared/traces/astrasim_megatron_tp8 (8 ranks, 31 MB of JSON).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "traces" / "astrasim_megatron_tp8"

PRELUDE = """
import gc, json, resource, sys, threading, time
import psutil
def peak_mib():
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024
class UssSampler(threading.Thread):
    # peak of the summed unique memory (USS) of this process and its workers: forked
    # workers share the parent's pages, which RSS would count once per process
    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.running = True
    def run(self):
        me = psutil.Process()
        while self.running:
            total = 0
            for p in [me] + me.children(recursive=True):
                try:
                    total += p.memory_full_info().uss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.01)
trace_dir, repeat, workers, measure_memory = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "mem"
workers = None if workers == "auto" else int(workers)
"""

GPUDIAG = (
    PRELUDE
    + """
from gpudiag.analysis import comms, stragglers
from gpudiag.analysis.breakdown import comm_comp_overlap, run_breakdown
from gpudiag.analysis.ingest import find_traces, load_traces
from gpudiag.analysis.pipeline import prepare_rank
base = peak_mib()
def work():
    warnings = []
    traces = load_traces(
        find_traces(trace_dir), warnings=warnings, workers=workers, prepare=prepare_rank
    )
    bd = run_breakdown(traces)
    table = comms.collective_table(traces)
    comms.collective_summary(table)
    comms.ddp_buckets(table)
    comms.allreduce_stall(traces, table)
    stragglers.stragglers(stragglers.arrival_skew(table), bd)
    [comm_comp_overlap(t) for t in traces]
    return sum(len(t.events) for t in traces)
"""
)

HTA = (
    PRELUDE
    + """
import logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
base = peak_mib()
def work():
    analysis = TraceAnalysis(trace_dir=trace_dir)
    analysis.get_temporal_breakdown(visualize=False)
    analysis.get_comm_comp_overlap(visualize=False)
    return sum(len(df) for df in analysis.t.traces.values())
"""
)

FLOOR = (
    PRELUDE
    + """
import gzip
from pathlib import Path
import orjson
files = sorted(p for p in Path(trace_dir).iterdir() if ".json" in p.name)
base = peak_mib()
def work():
    n = 0
    for p in files:
        data = p.read_bytes()
        if p.name.endswith(".gz"):
            data = gzip.decompress(data)
        n += len(orjson.loads(data)["traceEvents"])
    return n
"""
)

EPILOGUE = """
gc.collect()
base_uss = psutil.Process().memory_full_info().uss  # after imports, before any work
sampler = UssSampler()
if measure_memory:  # sampling costs CPU: memory runs are separate from timed runs
    sampler.start()
times = []
for _ in range(repeat):
    gc.collect()
    t0 = time.perf_counter()
    n = work()
    times.append(time.perf_counter() - t0)
sampler.running = False
if measure_memory:
    sampler.join()
print(json.dumps({"best_s": min(times), "median_s": sorted(times)[len(times) // 2],
                  "events": n, "peak_mib": peak_mib(), "base_mib": base,
                  "uss_mib": sampler.peak / 2**20,
                  "work_mib": (sampler.peak - base_uss) / 2**20}))
"""


def _run_once(code: str, trace_dir: Path, repeat: int, workers: str, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", code + EPILOGUE, str(trace_dir), str(repeat), workers, mode],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(code: str, trace_dir: Path, repeat: int, workers: str) -> dict:
    """Time in one subprocess (best of ``repeat``), memory in another (one pass, sampled)."""
    timed = _run_once(code, trace_dir, repeat, workers, "time")
    if "error" in timed:
        return timed
    memory = _run_once(code, trace_dir, 1, workers, "mem")
    timed["uss_mib"] = memory.get("uss_mib", float("nan"))
    timed["work_mib"] = memory.get("work_mib", float("nan"))
    timed["peak_mib"] = memory.get("peak_mib", float("nan"))
    return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--workers",
        default="auto",
        help="ingest processes (default: gpudiag's own plan: the cores, at most one per "
        "64 MiB of input, within the available memory)",
    )
    ap.add_argument("--no-hta", action="store_true")
    args = ap.parse_args(argv)
    results = {
        "gpudiag ingest + core analysis": run(GPUDIAG, args.trace_dir, args.repeat, args.workers),
        "gpudiag, one process (workers=1)": run(GPUDIAG, args.trace_dir, args.repeat, "1"),
        "gzip + orjson.loads (floor)": run(FLOOR, args.trace_dir, args.repeat, args.workers),
    }
    if not args.no_hta:
        results["HTA load + temporal breakdown + overlap"] = run(
            HTA, args.trace_dir, args.repeat, args.workers
        )
    ours = results["gpudiag ingest + core analysis"]
    print(f"trace set: {args.trace_dir}, best of {args.repeat}, imports excluded")
    print("USS = peak unique memory of the process and its workers (sampled every 10 ms,")
    print("in a separate untimed run), imports included;")
    print("work = that peak minus the USS after imports (imports excluded, like the times);")
    print(
        "RSS = peak resident set of the process + its largest worker (double-counts shared pages)"
    )
    head = (
        f"{'contender':<42} {'time s':>7} {'USS MiB':>8} {'work MiB':>8} {'RSS MiB':>8} "
        f"{'events':>7}"
    )
    print(head + "  ratio to gpudiag (time, USS, work)")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<42} error: {r['error']}")
            continue
        ratio = ""
        if r is not ours and "error" not in ours:
            ratio = (
                f"  x{r['best_s'] / ours['best_s']:.2f}, x{r['uss_mib'] / ours['uss_mib']:.2f},"
                f" x{r['work_mib'] / ours['work_mib']:.2f}"
            )
        print(
            f"{name:<42} {r['best_s']:>7.3f} {r['uss_mib']:>8.0f} {r['work_mib']:>8.0f} "
            f"{r['peak_mib']:>8.0f} {r['events']:>7}{ratio}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
