"""Scale checks.

1. (default) Analyse a SYNTHETIC 1024-rank run made only of per-rank summary.json
   files (clearly synthetic: the manifest says so; nothing here was recorded). Builds
   the run in a temporary directory, then analyses it in a fresh subprocess
   (`gpudiag.analysis.analyze`, which takes the summaries-only path above 256 ranks)
   and prints wall time and peak RSS side by side with the targets (30 s, 4 GB).

2. (--traces) A SYNTHETIC 256-rank trace directory built from REAL per-rank traces:
   rank r is a copy of recorded trace r % K of --source (default the 4 ranks of
   sample_runs/ddp4_straggler) with only distributedInfo.rank / world_size rewritten.
   Analysed in fresh subprocesses, alternated, --reps times each: the local process
   pool (--workers processes) and a Dask LocalCluster of --workers workers
   (`--scheduler local:N`). Prints wall time and the client's peak RSS (median and
   spread), checks that both give the same JSON, and that the cluster client stays
   under 1 GB (only per-rank results travel back to it).

    python bench/scale.py [--ranks 1024] [--slow-rank 617]
    python bench/scale.py --traces [--trace-ranks 256] [--reps 3] [--workers 2]
    python bench/scale.py --traces --trace-ranks 256,1024 --modes cluster --reps 1
        (each size, then the client's peak growth per rank between them: the slope)
    python bench/scale.py --traces --trace-ranks 256,1024 --modes remote --reps 1
        (the client of a `dask scheduler` and `dask worker`s started in their own
        processes, as on a real cluster: local:N runs the scheduler in the client's)
    python bench/scale.py --traces --trace-ranks 1024,16384 --modes replay --reps 1
        (the client alone at many ranks: each source trace's task runs once, every rank
        gets a copy of its source's result with the rank rewritten, as a worker would
        send it; same JSON as the pool's. Alone, replay links the ranks to the sources
        instead of writing copies. --source ../shared/traces/astrasim_megatron_tp8: a
        GPU job's shape, 84 collective calls per rank, where the growth per call shows)
    python bench/scale.py --traces --trace-ranks 8192 --modes replay --reps 1 --html
        (also the HTML report, its Timeline included, after the JSON)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 30.0
TARGET_GB = 4.0
CLIENT_TARGET_GB = 1.0
REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "sample_runs" / "ddp4_straggler" / "traces"

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from gpudiag.analysis import analyze
res = analyze(sys.argv[1])
payload = res.to_json()
elapsed = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "peak_gb": peak_kb / 2**20,
                  "findings": [(f["kind"], f["ranks"][:5]) for f in payload["findings"]],
                  "ranks": len(payload["ranks"])}))
"""


def write_synthetic_run(root: Path, ranks: int, slow_rank: int, seed: int = 0) -> None:
    """Summaries shaped like gpudiag/capture/summary.py writes them. One slow rank waits
    ~20 ms less per step inside collectives (the others wait for it)."""
    from gpudiag import rundir

    rng = random.Random(seed)
    rundir.write_json_atomic(
        rundir.manifest_path(root),
        {
            "format_version": rundir.FORMAT_VERSION,
            "world_size": ranks,
            "backend": "nccl",
            "status": "ok",
            "exit_code": 0,
            "synthetic": True,
            "note": "synthetic run for bench/scale.py; not a recording",
        },
    )
    steps = 500
    for r in range(ranks):
        wait_ms = 2.0 if r == slow_rank else 22.0 + rng.gauss(0, 0.5)
        step_ms = 100.0 + rng.gauss(0, 0.3)
        colls = [
            {
                "op": "all_reduce",
                "pg_name": "0",
                "count": steps * 4,
                "bytes": steps * 4 * 25 * 2**20,
                "known_time_ns": int(wait_ms * 1e6 * steps),
            },
            {
                "op": "broadcast",
                "pg_name": "0",
                "count": 2,
                "bytes": 2 * 2**20,
                "known_time_ns": 1000,
            },
        ]
        summary = {
            "format_version": rundir.FORMAT_VERSION,
            "rank": r,
            "status": "ok",
            "steps": {
                "count": steps,
                "mean_ms": step_ms,
                "median_ms": step_ms,
                "p90_ms": step_ms * 1.02,
                "min_ms": step_ms * 0.97,
                "max_ms": step_ms * 1.1,
                "total_ms": step_ms * steps,
                "data_ms_mean": 1.0 + rng.random(),
                "optimizer_ms_mean": 3.0,
            },
            "collectives": {"collectives": colls, "fr_lost_records": 0},
            "profiled_steps": [],
            "trace": None,
        }
        path = rundir.rank_dir(root, r) / rundir.SUMMARY
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))


def link_rank_copies(sources: list[Path], out: Path, ranks: int) -> list[Path]:
    """For --modes replay alone, which parses each source once and gives every rank a
    copy of its source's result (rank and world size rewritten, as write_rank_copies'
    files say): rank r's file is a link to ``sources[r % len(sources)]``, so 100k+ ranks
    need no copies on disk. Returns the links."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for r in range(ranks):
        path = out / f"rank{r}.pt.trace.json.gz"
        path.symlink_to(sources[r % len(sources)].resolve())
        files.append(path)
    return files


def write_rank_copies(sources: list[Path], out: Path, ranks: int) -> list[Path]:
    """SYNTHETIC ranks from REAL traces: rank r's file is recorded trace
    ``sources[r % len(sources)]`` with only ``distributedInfo.rank`` and ``world_size``
    rewritten (every event as recorded). Returns the files written."""
    import orjson

    out.mkdir(parents=True, exist_ok=True)
    docs = []
    for src in sources:
        raw = src.read_bytes()
        docs.append(orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw))
    files = []
    for r in range(ranks):
        doc = docs[r % len(docs)]
        info = doc.get("distributedInfo")
        doc["distributedInfo"] = {**(info if isinstance(info, dict) else {}), "rank": r}
        doc["distributedInfo"]["world_size"] = ranks
        path = out / f"rank{r}.pt.trace.json.gz"
        path.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
        files.append(path)
    return files


TRACES_CHILD = r"""
import hashlib, json, os, resource, sys, time
mode, path, workers, sources = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
try:  # set up as the `gpudiag analyze` command sets up its process (not in older checkouts)
    from gpudiag.cli import arrow_frees_to_the_system
    arrow_frees_to_the_system()
except ImportError:
    pass
from gpudiag.analysis import analyze
try:  # as `gpudiag analyze --json` writes it
    from gpudiag.report.jsonout import write_results
except ImportError:  # an older checkout
    from gpudiag.report.jsonout import write
    def write_results(results, out):
        write(results[0].to_json(), out)
analysis_s = 0.0
class HashingOut:  # the JSON's SHA-256, and the text to --keep-json's file, as written
    def __init__(self, path):
        self.sha, self.out = hashlib.sha256(), open(path, "w") if path else None
    def write(self, text):
        self.sha.update(text.encode())
        if self.out:
            self.out.write(text)
def run():
    global analysis_s
    a0 = time.perf_counter()
    if mode == "pool":
        res = analyze(path, workers=workers)
        analysis_s = time.perf_counter() - a0
        return res, 0.0, 0.0
    if mode == "inline":  # the cluster's tasks, one after another in this process
        import pickle
        from gpudiag.analysis.ingest import share_empty_events
        def run_tasks(task, jobs):
            for i, job in enumerate(jobs):
                trace, notes = pickle.loads(pickle.dumps(task(job)))  # as sent back
                if trace is not None:
                    share_empty_events(trace)
                yield i, (trace, notes)
        res = analyze(path, run_tasks=run_tasks)
        analysis_s = time.perf_counter() - a0
        return res, 0.0, 0.0
    if mode == "replay":  # each source trace's task once; rank r gets source r % K's result
        import dataclasses, pickle, re
        from gpudiag.analysis.ingest import share_empty_events
        done = {}
        def run_tasks(task, jobs):
            for i, job in enumerate(jobs):
                rank = int(re.search(r"rank(\d+)", job[0].rsplit("/", 1)[-1]).group(1))
                if rank % sources not in done:
                    done[rank % sources] = pickle.dumps(task(job))
                trace, notes = pickle.loads(done[rank % sources])
                new = {"rank": rank, "path": type(trace.meta.path)(job[0]), "world_size": len(jobs)}
                if hasattr(trace.meta, "distributed_info"):  # an older checkout's copy
                    new["distributed_info"] = {**(trace.meta.distributed_info or {}), "rank": rank}
                trace.meta = dataclasses.replace(trace.meta, **new)
                share_empty_events(trace)
                yield i, (trace, notes)
        res = analyze(path, run_tasks=run_tasks)
        analysis_s = time.perf_counter() - a0
        return res, 0.0, 0.0
    from gpudiag.analysis.dask_tasks import connect
    s0 = time.perf_counter()
    spec, procs = f"local:{workers}", []
    if mode == "remote":  # `dask scheduler` and `dask worker` in their own processes
        import os, subprocess, tempfile
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        where = os.path.join(tempfile.mkdtemp(prefix="gpudiag-scale-dask-"), "scheduler.json")
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
            "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", where],
            **quiet))
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
            "--scheduler-file", where, "--nworkers", str(workers), "--nthreads", "1",
            "--no-dashboard", "--host", "127.0.0.1"], **quiet))
        while True:
            try:
                spec = json.load(open(where))["address"]
                break
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
    try:
        with connect(spec) as tasks:
            tasks.client.wait_for_workers(workers, timeout=120)
            started = time.perf_counter() - s0
            a0 = time.perf_counter()
            res = analyze(path, run_tasks=tasks)
            analysis_s = time.perf_counter() - a0
            # the tasks' compute time, summed by the scheduler (a task stream would keep
            # a record per task in the scheduler, which local:N runs in this process)
            busy = tasks.client.run_on_scheduler(
                lambda dask_scheduler: sum(
                    p.all_durations.get("compute", 0.0)
                    for p in dask_scheduler.task_prefixes.values()
                )
            )
            return res, started, busy
    finally:
        for proc in procs[::-1]:
            proc.terminate()
            proc.wait()
if __name__ == "__main__":
    res, startup, task_s = run()
    out = HashingOut(sys.argv[5] if len(sys.argv) > 5 else None)  # --keep-json's file
    write_results([res], out)
    if out.out:
        out.out.close()
    elapsed = time.perf_counter() - t0
    measured = {"seconds": elapsed, "startup_s": startup, "task_s": task_s,
                "analysis_s": analysis_s,
                "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "ranks": len(res.ranks), "calls": len(res.collectives), "sha": out.sha.hexdigest(),
                "findings": [(f.kind, f.ranks[:4]) for f in res.findings]}
    if os.environ.get("GPUDIAG_BENCH_HTML"):  # --html: the report too, after the JSON
        from gpudiag.report.html import render_html
        h0 = time.perf_counter()
        html = render_html([res])
        # an older checkout (run with its own code) has no timeline_ranks: every rank drawn
        measured.update(html_s=time.perf_counter() - h0, html_mb=len(html) / 2**20,
                        html_peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                        timeline_ranks=len(getattr(res, "timeline_ranks", lambda: None)() or res.ranks))
    print(json.dumps(measured))
"""


def _gb(gib: float) -> float:
    """GiB (what the children measure: ru_maxrss in KiB / 2**20) in GB, the targets' unit."""
    return gib * 2**30 / 1e9


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f}  [{min(values):.2f}-{max(values):.2f}]"


def bench_sizes(args: argparse.Namespace) -> int:
    """--traces at each size of --trace-ranks (e.g. 256,1024), then the client's growth
    per rank between the smallest and the largest size, per mode."""
    sizes = sorted({int(n) for n in str(args.trace_ranks).split(",") if n.strip()})
    peaks: dict[int, dict[str, float]] = {}
    status = 0
    for n in sizes:
        status |= bench_traces(args, n, peaks.setdefault(n, {}))
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for mode in peaks[lo]:
            if mode in peaks[hi] and not mode.endswith(" calls"):
                grown = (peaks[hi][mode] - peaks[lo][mode]) * 2**30
                calls = peaks[hi][f"{mode} calls"] - peaks[lo][f"{mode} calls"]
                per_call = f", {grown / calls:.0f} B per collective call" if calls else ""
                print(
                    f"client peak growth per rank, {mode}, {lo} -> {hi} ranks: "
                    f"{grown / (hi - lo) / 1024:.1f} kB{per_call} "
                    f"(median peaks {peaks[lo][mode]:.3f} -> {peaks[hi][mode]:.3f} GiB)"
                )
    return status


def bench_traces(args: argparse.Namespace, ranks: int, peaks: dict[str, float]) -> int:
    """One size; ``peaks``: filled with each mode's median client peak (GiB)."""
    sources = sorted(p for p in Path(args.source).iterdir() if ".json" in p.name)
    if not sources:
        print(f"no traces in {args.source}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="gpudiag-scale-traces-") as tmp:
        run = Path(tmp) / "synthetic_traces"
        t0 = time.perf_counter()
        wanted = args.modes.split(",")
        if set(wanted) == {"replay"}:
            files = link_rank_copies(sources, run, ranks)
            made = "links: rank r's file is a link to trace r % K, its result copied with rank and world size rewritten"
        else:
            files = write_rank_copies(sources, run, ranks)
            size_mb = sum(f.stat().st_size for f in files) / 2**20
            made = (
                f"rank r = copy of trace r % {len(sources)} with distributedInfo.rank/"
                f"world_size rewritten; {size_mb:.0f} MiB gzip"
            )
        print(
            f"SYNTHETIC {ranks}-rank run built from {len(sources)} REAL recorded "
            f"traces ({args.source}): {made} (built in {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        modes = [m for m in ("pool", "cluster", "remote", "inline", "replay") if m in wanted]
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for rep in range(args.reps):
            order = modes if rep % 2 == 0 else modes[::-1]
            for mode in order:
                keep = [f"{args.keep_json}/{mode}-{ranks}-{rep + 1}.json"] if args.keep_json else []
                out = subprocess.run(
                    [sys.executable, "-c", TRACES_CHILD, mode, str(run), str(args.workers)]
                    + [str(len(sources)), *keep],
                    capture_output=True,
                    text=True,
                    check=False,
                    env={**os.environ, **({"GPUDIAG_BENCH_HTML": "1"} if args.html else {})},
                )
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    return 1
                m = json.loads(out.stdout.strip().splitlines()[-1])
                runs[mode].append(m)
                print(
                    f"  rep {rep + 1} {mode:<8}{m['seconds']:8.1f} s  client peak "
                    f"{m['peak_gb']:.3f} GiB  ranks {m['ranks']}  collective calls "
                    f"{m.get('calls', 0)}  (1-min load average "
                    f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
                    flush=True,
                )
                if "html_s" in m:
                    print(
                        f"      --html: the report in {m['html_s']:.1f} s ({m['html_mb']:.1f} "
                        f"MiB), client peak with it {m['html_peak_gb']:.3f} GiB, its "
                        f"Timeline draws {m['timeline_ranks']} ranks",
                        flush=True,
                    )
    shas = {m["sha"] for ms in runs.values() for m in ms}
    label = {
        "pool": f"local pool, {args.workers} processes",
        "cluster": f"LocalCluster, {args.workers} workers",
        "remote": f"dask scheduler + {args.workers} workers",
        "inline": "inline (tasks in the client)",
        "replay": f"replay ({len(sources)} tasks, copied)",
    }
    print(f"{'':<32}{'wall s median [min-max]':>26}{'client peak GiB':>28}")
    for mode, ms in runs.items():
        print(
            f"{label[mode]:<32}{_spread([m['seconds'] for m in ms]):>26}"
            f"{_spread([m['peak_gb'] for m in ms]):>28}"
        )
    cluster = runs.get("cluster", [])
    if cluster:
        startup = [m["startup_s"] for m in cluster]
        print(f"(cluster wall time includes starting the LocalCluster: {_spread(startup)} s)")
    for mode, ms in runs.items():
        analysis = [m.get("analysis_s", 0.0) for m in ms]
        print(
            f"({label[mode]}: analyze() alone, without imports, start-up, shutdown: {_spread(analysis)} s)"
        )
    if cluster:
        task_s = [m.get("task_s", 0.0) for m in cluster]
        print(f"(cluster: per-rank tasks' compute time summed over workers: {_spread(task_s)} s)")
    by_mode = {mode: len({m["sha"] for m in ms}) for mode, ms in runs.items()}
    first = next(iter(runs.values()))[0]
    print(
        f"same JSON in every run: {len(shas) == 1} (distinct: {len(shas)} overall, "
        f"{by_mode} per mode); findings: {first['findings']}"
    )
    clients = [m["peak_gb"] for mode in ("cluster", "remote") for m in runs.get(mode, [])]
    client_gb = max(clients, default=0.0)
    if clients:
        print(
            f"cluster client peak {client_gb:.3f} GiB = {_gb(client_gb):.3f} GB "
            f"(target < {CLIENT_TARGET_GB} GB)"
        )
    for mode, ms in runs.items():
        peaks[mode] = statistics.median(m["peak_gb"] for m in ms)
        peaks[f"{mode} calls"] = float(ms[0].get("calls", 0))
    return 0 if len(shas) == 1 and _gb(client_gb) < CLIENT_TARGET_GB else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--slow-rank", type=int, default=617)
    ap.add_argument("--traces", action="store_true", help="the trace-based pool vs cluster run")
    ap.add_argument(
        "--trace-ranks",
        default="256",
        help="ranks of the synthetic run; several (256,1024): each, then the growth per rank",
    )
    ap.add_argument("--source", default=str(DEFAULT_SOURCE), help="directory of real traces")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep-json", metavar="DIR", help="leave each run's JSON in DIR")
    ap.add_argument(
        "--html",
        action="store_true",
        help="--traces: also render the HTML report after the JSON; prints its time and the "
        "client's peak with it",
    )
    ap.add_argument(
        "--modes",
        default="pool,cluster",
        help="which of pool,cluster,remote,inline,replay to run (e.g. cluster alone at 1024+ "
        "ranks; remote: a `dask scheduler` and --workers `dask worker` processes started "
        "here, the client in its own process as on a real cluster; inline: the cluster's per-rank tasks run one by one in the client process, no "
        "scheduler: the client's own memory; replay: as inline, but each source trace's "
        "task runs once and every rank gets a copy of its source's result, rank rewritten: "
        "the client's memory at 16k+ ranks in minutes)",
    )
    args = ap.parse_args()
    if args.traces:
        return bench_sizes(args)
    with tempfile.TemporaryDirectory(prefix="gpudiag-scale-") as tmp:
        run = Path(tmp) / "synthetic_run"
        t0 = time.perf_counter()
        write_synthetic_run(run, args.ranks, args.slow_rank)
        build_s = time.perf_counter() - t0
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        m = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"synthetic run: {args.ranks} ranks of summary.json (built in {build_s:.1f} s)")
    print(f"{'metric':<12}{'measured':>12}{'target':>10}{'ratio':>8}")
    print(f"{'time s':<12}{m['seconds']:>12.2f}{TARGET_S:>10.1f}{m['seconds'] / TARGET_S:>8.3f}")
    peak = _gb(m["peak_gb"])
    print(f"{'peak GB':<12}{peak:>12.3f}{TARGET_GB:>10.1f}{peak / TARGET_GB:>8.3f}")
    print(f"ranks analysed: {m['ranks']}; findings: {m['findings']}")
    ok = m["seconds"] <= TARGET_S and peak <= TARGET_GB
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
