"""Cost of `gpudiag trace --no-profile` on a 2-rank gloo DDP job, as a user sees it.

The same job runs bare (`python -m torch.distributed.run`) and under gpudiag, alternated
in pairs (bare first in even pairs, gpudiag first in odd ones, so drift in the machine's
load falls on both equally). The training script (tests/scripts/capture_ddp_mlp.py)
times its own steps with the wall clock and writes them to a file: the same clock and
the same code in both modes, nothing read from gpudiag's own records. Per run: the
median step time over both ranks, warm-up steps dropped. Printed: every pair, the
median of the per-pair ratios with their spread (min, quartiles, max), the ratio of the
medians, the machine's load average while measuring, and (for comparison only) the
same on process CPU time, and the CPU share of the started process itself (gpudiag's
launcher: sampler, watchdog; torchrun's agent when bare), which takes its CPU from the
ranks on a machine whose cores they use and depends little on other load. Target:
wall-clock ratio <= 1.02.

With --control, a second bare run takes a third slot in every pair: bare/bare shows
the noise floor of the machine at that moment (it should be 1.00), and gpudiag is also
compared with the mean of the two bare runs around it.

Where the CPU goes, robust to other load: rank 0 reads /proc/<pid>/task/*/schedstat
(CPU ns of each thread) and the context switches of every thread of each rank, of the
agent and of gpudiag's launcher at the end of the warm-up and at the end of its loop
(tests/scripts/capture_ddp_mlp.py --thread-cpu). gpudiag's threads carry their names in
the kernel (gpudiag-sampler, gpudiag-watchdog, gpudiag-clock; in a rank one
gpudiag-service, which runs what gpudiag-hangdump and gpudiag-lwatch ran), so the table printed at the end charges each one's CPU µs per step
(both ranks summed), its share of the bare median step, and its wakeups per step.

    python bench/overhead.py [--pairs 7] [--steps 200] [--width 512] [--depth 4] [--control]
                             [--baseline-tree DIR] [--save FILE.json]

The bare median step time is printed with each pair (aim for ~20 ms). On a shared
machine prefer more pairs (--pairs 15) and read the spread: a pair is only comparable
within itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
WARMUP_STEPS = 10
METRICS = ("ms", "cpu_ms")
MIN_PAIRS = 5


def run_job(
    mode: str, workdir: Path, index: int, args: argparse.Namespace
) -> dict[str, float] | None:
    """Median wall and CPU step time (ms) over both ranks, warm-up steps dropped."""
    times = workdir / f"{mode}-{index}.jsonl"
    script = [str(SCRIPT), "--steps", str(args.steps), "--width", str(args.width),
              "--depth", str(args.depth), "--batch", str(args.batch), "--times", str(times),
              "--thread-cpu", str(WARMUP_STEPS)]  # fmt: skip
    torchrun = ["--nproc-per-node", "2", "--standalone"]
    source = args.baseline_tree if mode == "baseline" else REPO
    if mode in ("gpudiag", "baseline"):
        cmd = [sys.executable, "-m", "gpudiag", "trace", "--out",
               str(workdir / f"run-{mode}-{index}"), "--no-profile", "--no-lint", *torchrun,
               *script]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, *script]
    log = workdir / f"{mode}-{index}.log"
    env = dict(os.environ, PYTHONPATH=str(source), OVERHEAD_BENCH_PID=str(os.getpid()))
    with open(log, "w") as fh:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT, env=env)
        cpu_s = _top_process_cpu(proc)
        wall_s = time.monotonic() - t0
    rows = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    if len(rows) != 2:
        # (a bare gloo worker may abort in teardown after writing its times: FACTS.md)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"{mode} run {index} failed (exit {proc.returncode}); its log ends:\n{tail}")
        return None
    result = {m: statistics.median(v for r in rows for v in r[m][WARMUP_STEPS:]) for m in METRICS}
    # the launcher's own CPU (gpudiag's extra process; torchrun's agent when bare) as a
    # share of one core over the run: what it takes from the ranks, barely load-dependent
    result["top_cpu_share"] = cpu_s / wall_s if wall_s > 0 else float("nan")
    result.update(thread_pieces(rows, args.steps - WARMUP_STEPS))
    return result


def _role(cmdline: str, is_rank: bool) -> str:
    if is_rank:
        return "rank"
    if "gpudiag.capture.agent" in cmdline or "torch.distributed.run" in cmdline:
        return "agent"
    return "launcher" if "gpudiag" in cmdline else "other"


def thread_pieces(rows: list[dict], steps: int) -> dict[str, float]:
    """CPU µs per step (both ranks together) and context switches per step of each
    thread kind of each process, from the script's /proc snapshots at the end of the
    warm-up and at the end of its loop (``cpu:<process>/<thread>``, ``csw:...``)."""
    out: dict[str, float] = {}
    for row in rows:
        snaps = row.get("threads") or []
        if len(snaps) != 2 or steps <= 0:
            continue
        before = {(t[0], t[1]): t for t in snaps[0]["tasks"]}
        own = str(row["pid"])
        for pid, tid, comm, cpu_ns, switches in snaps[1]["tasks"]:
            role = _role(snaps[1]["procs"].get(str(pid), ""), str(pid) == own)
            if role == "other":
                continue
            thread = "main" if pid == tid else comm
            old = before.get((pid, tid))
            d_cpu = cpu_ns - (old[3] if old else 0)
            d_csw = switches - (old[4] if old else 0)
            key = f"{role}/{thread}"
            out[f"cpu:{key}"] = out.get(f"cpu:{key}", 0.0) + d_cpu / 1e3 / steps
            out[f"csw:{key}"] = out.get(f"csw:{key}", 0.0) + d_csw / steps
    return out


def piece_table(results: dict[str, list[dict[str, float]]], modes: list[str]) -> list[str]:
    """Median over the runs of each mode of every thread's CPU µs and context switches
    per step, and its share of the bare median step (one core)."""
    keys = sorted({k[4:] for m in modes for r in results[m] for k in r if k.startswith("cpu:")})
    step_us = statistics.median(r["ms"] for r in results["bare"]) * 1e3
    shown = [m for m in modes if m != "bare2"]
    head = "".join(f" | {m} µs/step | {m} % of step | {m} wakeups/step" for m in shown)
    lines = [f"| process/thread{head} |", "|---" * (1 + 3 * len(shown)) + "|"]
    totals = {m: 0.0 for m in shown}
    for key in keys:
        cells = ""
        for m in shown:
            cpu = statistics.median(r.get(f"cpu:{key}", 0.0) for r in results[m])
            csw = statistics.median(r.get(f"csw:{key}", 0.0) for r in results[m])
            totals[m] += cpu
            cells += f" | {cpu:.1f} | {100 * cpu / step_us:.2f} | {csw:.2f}"
        lines.append(f"| {key}{cells} |")
    cells = "".join(f" | {totals[m]:.1f} | {100 * totals[m] / step_us:.2f} | " for m in shown)
    lines.append(f"| sum of medians{cells} |")
    return lines


def _top_process_cpu(proc: subprocess.Popen) -> float:
    """CPU seconds of the started process itself (not its children), sampled until it
    exits (the last half second is missed)."""
    import psutil

    cpu = 0.0
    try:
        handle = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                t = handle.cpu_times()
                cpu = t.user + t.system
            except psutil.Error:
                pass
            time.sleep(0.5)
    finally:
        proc.wait(timeout=1200)
    return cpu


def spread(values: list[float]) -> str:
    values = sorted(values)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return f"min {values[0]:.3f}  q1 {q1:.3f}  q3 {q3:.3f}  max {values[-1]:.3f}"
    return f"min {values[0]:.3f}  max {values[-1]:.3f}"


def summary(label: str, a: list[dict[str, float]], b: list[dict[str, float]], metric: str) -> str:
    ratios = [y[metric] / x[metric] for x, y in zip(a, b, strict=True)]
    ma = statistics.median(x[metric] for x in a)
    mb = statistics.median(x[metric] for x in b)
    return (
        f"{label:<26} median of pair ratios {statistics.median(ratios):.3f}  "
        f"({spread(ratios)});  ratio of medians {mb / ma:.3f} ({ma:.2f} vs {mb:.2f} ms)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--control", action="store_true", help="also bare vs bare (noise floor)")
    p.add_argument(
        "--baseline-tree",
        type=Path,
        help="also gpudiag from this source tree (e.g. `git archive <commit>` unpacked): "
        "before/after a change, in the same pairs",
    )
    p.add_argument("--save", type=Path, help="also write every run's figures to this JSON file")
    args = p.parse_args()
    if args.pairs < MIN_PAIRS:
        p.error(f"--pairs must be at least {MIN_PAIRS}")
    modes = ["bare", "gpudiag"] + ["bare2"] * args.control + ["baseline"] * bool(args.baseline_tree)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    loads = []
    print(f"host: {os.cpu_count()} cores; {args.pairs} pairs of {args.steps} steps "
          f"(first {WARMUP_STEPS} dropped), width {args.width}, depth {args.depth}, "
          f"batch {args.batch}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpudiag-overhead-") as tmp:
        for i in range(args.pairs):
            order = modes if i % 2 == 0 else list(reversed(modes))
            pair = {}
            for mode in order:
                loads.append(os.getloadavg()[0])
                pair[mode] = run_job(mode, Path(tmp), i, args)
            if None in pair.values():
                continue  # a failed job is reported above and leaves the pair out
            for mode, result in pair.items():
                results[mode].append(result)
            line = "   ".join(f"{m} {results[m][-1]['ms']:7.2f} ms" for m in modes)
            ratio = results["gpudiag"][-1]["ms"] / results["bare"][-1]["ms"]
            print(f"pair {i + 1} ({' then '.join(order)}): {line}   ratio {ratio:.3f}", flush=True)
    if args.save:
        args.save.write_text(json.dumps({"args": vars(args) | {"save": None, "baseline_tree": None},
                                         "loads": loads, "results": results}))  # fmt: skip
    print()
    print(f"load average (1 min) while measuring: median {statistics.median(loads):.1f}, "
          f"min {min(loads):.1f}, max {max(loads):.1f}")  # fmt: skip
    if len(results["bare"]) < MIN_PAIRS:
        print(f"only {len(results['bare'])} complete pairs: not enough for a figure")
        return 1
    print(summary("wall: gpudiag/bare", results["bare"], results["gpudiag"], "ms"))
    if args.control:
        print(summary("wall: bare/bare (noise)", results["bare"], results["bare2"], "ms"))
        both = [{"ms": (x["ms"] + y["ms"]) / 2} for x, y in zip(results["bare"], results["bare2"], strict=True)]  # fmt: skip
        print(summary("wall: gpudiag/mean(bares)", both, results["gpudiag"], "ms"))
    if args.baseline_tree:
        print(summary("wall: baseline/bare", results["bare"], results["baseline"], "ms"))
    print(summary("cpu:  gpudiag/bare", results["bare"], results["gpudiag"], "cpu_ms"))
    if args.control:
        print(summary("cpu:  bare/bare (noise)", results["bare"], results["bare2"], "cpu_ms"))
    for mode in modes:
        shares = [r["top_cpu_share"] * 100 for r in results[mode]]
        print(f"CPU of the started process ({mode}): median {statistics.median(shares):.2f} % "
              f"of a core ({spread(shares)})")  # fmt: skip
    print()
    print(
        "CPU per step of every thread (median over runs; both ranks summed; from /proc "
        "schedstat between the end of the warm-up and the end of the loop):"
    )
    for line in piece_table(results, modes):
        print(line)
    print("target: wall-clock gpudiag/bare <= 1.02")
    return 0


if __name__ == "__main__":
    sys.exit(main())
