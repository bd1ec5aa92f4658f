"""What each piece of gpudiag's always-on capture costs, measured in isolation.

Each piece is timed on its own (CPU time of this process, many repetitions, median of
several rounds) and put in proportion to a 20 ms training step: per-step work directly,
background threads (the launcher's sampler and watchdog, the workers' hang-dump poller)
as the CPU share they take from a machine whose cores the ranks need.

    python bench/overhead_parts.py [--rounds 5]

The ranks of a 2-rank job on a 2-core machine use both cores, so a background thread's
CPU share is taken from the training: 1 % of a core costs ~1 % of step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEP_MS = 20.0


def per_call_us(func: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """(median, max) over rounds of the CPU µs per call."""
    results = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            func()
        results.append((time.process_time() - t0) / calls * 1e6)
    return statistics.median(results), max(results)


def row(name: str, us: tuple[float, float], per_step: float, note: str = "") -> None:
    """per_step: how many calls fall in one 20 ms step (fraction for periodic work)."""
    cost = us[0] * per_step
    print(
        f"{name:<44} {us[0]:9.1f} µs/call (max {us[1]:8.1f})  "
        f"{cost:8.1f} µs/step = {cost / (STEP_MS * 1000) * 100:6.3f} %  {note}",
        flush=True,
    )


def bench_launcher_side(tmp: Path, rounds: int) -> None:
    import psutil

    from gpudiag import rundir
    from gpudiag.capture import launcher, sampler, watchdog

    # a job shaped like torchrun: one agent and two workers below this process
    code = "import subprocess,sys,time;" + ";".join(
        ["ps=[subprocess.Popen([sys.executable,'-c','import time;time.sleep(120)']) for _ in (0,1)]",
         "time.sleep(120)"]
    )  # fmt: skip
    job = launcher.Job([sys.executable, "-c", code], dict(os.environ))
    time.sleep(1.5)
    try:
        scans = 1.0 / 0.1 * STEP_MS / 1000  # 10 Hz, per 20 ms step
        row("Job.pids() (/proc children files)", per_call_us(job.pids, 50, rounds), scans / 50,
            f"every 5 s; {len(psutil.pids())} processes on this host")  # fmt: skip
        s = sampler.Sampler(tmp / "run", interval_s=0.1, pids_provider=job.pids)
        s._host_writer = rundir.open_node_table(tmp / "run", 0, rundir.HOST_SAMPLES)
        import psutil as _p

        _p.cpu_percent(None)
        row("sampler.sample_once, scanning pids", per_call_us(s.sample_once, 50, rounds), scans)
        cached = job.pids()
        s.pids_provider = lambda: cached
        row("sampler.sample_once, known pids", per_call_us(s.sample_once, 50, rounds), scans)
        for r in (0, 1):
            rdir = rundir.rank_dir(tmp / "run", r)
            rdir.mkdir(parents=True, exist_ok=True)
            for t in ("steps", "collectives", "collective_times", "ddp_stats"):
                rundir.table_path(rdir, t).write_text("{}\n")
        polls = 1.0 * STEP_MS / 1000  # every 1 s at the default --hang-timeout
        row("watchdog progress_signature", per_call_us(
            lambda: watchdog.progress_signature(tmp / "run"), 200, rounds), polls)  # fmt: skip
    finally:
        job.kill()
        job.proc.wait()


def bench_worker_side(tmp: Path, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from gpudiag import rundir
    from gpudiag.capture import collectives, hangdump

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    writer = rundir.open_rank_table(tmp / "w", 0, rundir.STEPS)
    line = '{"step":1,"start_ns":1,"end_ns":2,"data_ns":0,"optimizer_ns":0,"source":"optimizer"}\n'
    row("steps.jsonl row (write syscall)", per_call_us(lambda: writer.write_text(line), 2000,
        rounds), 1)  # fmt: skip

    recorder = collectives.CollectiveRecorder(tmp / "w", 0)
    recorder.install()
    t = torch.ones(1000)
    original = recorder._originals["all_reduce"]
    wrapped = dist.all_reduce
    base = per_call_us(lambda: original(t), 500, rounds)
    patched = per_call_us(lambda: wrapped(t), 500, rounds)
    row("patched dist.all_reduce: extra per call", (patched[0] - base[0], patched[1]), 1,
        f"(bare call {base[0]:.0f} µs; user calls only, DDP's buckets bypass it)")  # fmt: skip
    recorder._flush_times()

    for _ in range(2000):
        original(t)
    entries = len(collectives.dump_flight_recorder())
    dump = per_call_us(collectives.dump_flight_recorder, 5, rounds)
    per_step = max(2 / (0.75 * max(entries, 1)), STEP_MS / 1000 / 10)
    row(f"Flight Recorder dump of {entries} entries", dump, per_step,
        "per step at 2 collectives/step (one dump per 0.75 ring new, or per 10 s)")  # fmt: skip

    # a small model: the per-iteration cost of runtime logging is what is measured
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    )
    x = torch.randn(8, 64)

    def step() -> None:
        model(x).sum().backward()

    for _ in range(20):
        step()
    default = []
    logged = []
    for _ in range(2 * rounds):  # alternated blocks
        model._set_ddp_runtime_logging_sample_rate(100)
        default.append(per_call_us(step, 100, 1)[0])
        model._set_ddp_runtime_logging_sample_rate(1)
        logged.append(per_call_us(step, 100, 1)[0])
    diff = statistics.median(b - a for a, b in zip(default, logged, strict=True))
    row("DDP runtime logging every iteration: extra", (diff, max(logged) - min(default)), 1,
        f"(DDP step {statistics.median(default):.0f} µs)")  # fmt: skip
    fetch = per_call_us(model._get_ddp_logging_data, 50, rounds)
    row("DDP _get_ddp_logging_data (every 10th step)", fetch, 0.1)

    poll = per_call_us(hangdump._flush_stale_times, 2000, rounds)
    exists = per_call_us(lambda: hangdump.request_path(tmp / "w", 0).exists(), 2000, rounds)
    row("hang-dump poller iteration", (poll[0] + exists[0], poll[1] + exists[1]),
        2.0 * STEP_MS / 1000, "every 0.5 s")  # fmt: skip
    writer.close()
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    load = os.getloadavg()
    print(f"host: {os.cpu_count()} cores, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"cost relative to a {STEP_MS:g} ms step")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpudiag-parts-") as tmp:
        bench_launcher_side(Path(tmp), args.rounds)
        if os.environ.get("_GPUDIAG_PARTS_CHILD") != "1":
            # the worker side in a fresh process (its own process group and FR ring)
            env = dict(os.environ, _GPUDIAG_PARTS_CHILD="1", PYTHONPATH=str(REPO))
            subprocess.run(
                [sys.executable, "-c", "import sys; sys.argv=['x']; "
                 "from bench.overhead_parts import worker_main; worker_main()",
                 str(args.rounds)], env=env, cwd=REPO, check=False)  # fmt: skip
    return 0


def worker_main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
    with tempfile.TemporaryDirectory(prefix="gpudiag-parts-") as tmp:
        bench_worker_side(Path(tmp), rounds)


if __name__ == "__main__":
    sys.exit(main())
