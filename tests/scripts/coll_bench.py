"""Cost of the collective recorder on a 2-rank gloo job, printed side by side.

    python tests/scripts/coll_bench.py            # starts 2 ranks of itself

Measures (interleaved A B A B so machine noise hits both sides alike):
- DDP step time with gpudiag's timed comm hook vs DDP's C++ default all-reduce;
- a small dist.all_reduce through the patched function vs the original;
- a Flight Recorder JSON dump: cost per entry and per dump with a full ring, and what
  the recorder's adaptive dump interval costs per step.
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = int(os.environ.get("COLL_BENCH_ROUNDS", "6"))
STEPS_PER_ROUND = 15


def _child() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpudiag.capture import ddp
    from gpudiag.capture.collectives import CollectiveRecorder, dump_flight_recorder

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    rec = CollectiveRecorder(Path(sys.argv[2]), rank)
    rec.install()
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    base = torch.nn.Sequential(*layers)
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.25)
    plain = DDP(copy.deepcopy(base), bucket_cap_mb=0.25)
    ddp.leave_untouched(plain)
    # the same Python hook without gpudiag's timing: splits the hook's cost from ours
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    untimed = DDP(copy.deepcopy(base), bucket_cap_mb=0.25)
    DDP.register_comm_hook.__wrapped__(untimed, None, default_hooks.allreduce_hook)
    x = torch.randn(64, 256)
    step_no = 0

    def run(model: torch.nn.Module) -> list[float]:
        nonlocal step_no
        times = []
        for _ in range(STEPS_PER_ROUND):
            t0 = time.perf_counter()
            model(x).sum().backward()
            times.append(time.perf_counter() - t0)
            rec.on_step_end(step_no, time.time_ns())
            step_no += 1
        return times

    run(hooked), run(plain), run(untimed)  # warm-up, bucket rebuild
    a, b, c = [], [], []
    for _ in range(ROUNDS):
        a += run(hooked)
        b += run(plain)
        c += run(untimed)
    original = rec._originals["all_reduce"]
    small = torch.ones(16)
    pa, pb = [], []
    for _ in range(ROUNDS):
        for fn, out in ((dist.all_reduce, pa), (original, pb)):
            t0 = time.perf_counter()
            for _ in range(50):
                fn(small)
            out.append((time.perf_counter() - t0) / 50)
    summary = rec.summary()
    t0 = time.perf_counter()
    for i in range(100):
        ddp.record_step(rec, step_no + i, time.time_ns())
    ddp_stats_us = (time.perf_counter() - t0) / 100 * 1e6 / len(rec._ddp_models)
    for _ in range(2000):  # fill the ring
        original(small)
    t0 = time.perf_counter()
    entries = len(dump_flight_recorder())
    full_dump = time.perf_counter() - t0
    rec.close()
    if rank == 0:
        med = statistics.median
        print(f"ddp_stats row per model per step: {ddp_stats_us:.1f} us")
        print(
            f"DDP step (12x256 MLP, {len(a)} steps each): hooked {med(a) * 1e3:.2f} ms, "
            f"default {med(b) * 1e3:.2f} ms, ratio {med(a) / med(b):.3f}; untimed Python "
            f"allreduce_hook {med(c) * 1e3:.2f} ms, ratio to it {med(a) / med(c):.3f}"
        )
        print(
            f"dist.all_reduce(16 floats): patched {med(pa) * 1e6:.1f} us, original "
            f"{med(pb) * 1e6:.1f} us, ratio {med(pa) / med(pb):.3f}, "
            f"+{(med(pa) - med(pb)) * 1e6:.1f} us per call"
        )
        print(
            f"FR dump, full ring: {entries} entries in {full_dump * 1e3:.1f} ms "
            f"({full_dump / max(entries, 1) * 1e6:.1f} us per entry)"
        )
        every = summary["fr_dump_every_steps"]
        print(
            f"recorder dumps during the run: {summary['fr_dumps']} dumps, median "
            f"{(summary['fr_dump_median_ns'] or 0) / 1e6:.2f} ms, every {every} steps "
            f"-> {(summary['fr_dump_median_ns'] or 0) / every / 1e3:.1f} us per step; "
            f"lost records {summary['fr_lost_records']}"
        )
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import coll_launch

    with tempfile.TemporaryDirectory() as run:
        port = coll_launch.free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "child", run],
                env=dict(
                    os.environ,
                    RANK=str(r),
                    WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    OMP_NUM_THREADS="1",
                ),
            )
            for r in range(2)
        ]
        sys.exit(max(abs(p.wait()) for p in procs))


if __name__ == "__main__":
    _child() if len(sys.argv) > 1 and sys.argv[1] == "child" else main()
