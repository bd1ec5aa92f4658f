"""Does overlapping DDP's all-reduce with the backward give time back on a CPU-only host
whose ranks fill the cores? (docs/findings.md, "A loaded host lowers severity in
proportion": why exposed communication is not rated low on such hosts.)

Runs the same 2-rank gloo DDP job (8 Linear(W, W) layers, batch 8, one compute thread per
rank, torchrun's default) with one bucket (bucket_cap_mb=1000: the all-reduce starts after
the backward, nothing overlapped) and with 1 MB buckets (the all-reduces start during the
backward), alternated, and prints each one's median step and spread over the repetitions.

    python bench/cpu_overlap.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = """
import statistics, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
cap, width = float(sys.argv[1]), int(sys.argv[2])
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]),
            bucket_cap_mb=cap)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(8, width)
times = []
for _ in range(60):
    t = time.perf_counter()
    opt.zero_grad(); model(x).sum().backward(); opt.step()
    times.append((time.perf_counter() - t) * 1e3)
if dist.get_rank() == 0:
    print(f"median_ms={statistics.median(times[10:]):.3f}")
dist.destroy_process_group()
"""

CONFIGS = {"one bucket (no overlap)": 1000.0, "1 MB buckets (overlapped)": 1.0}


def run_once(script: Path, cap: float, width: int, port: int) -> float:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(port), str(script), str(cap), str(width),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    found = re.search(r"median_ms=([0-9.]+)", out)
    if found is None:
        raise RuntimeError(f"no timing in the job's output: {out[-500:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--port", type=int, default=29840)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; 2 ranks of 1 thread; width {args.width}; load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    results: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        for rep in range(args.repeat):
            for name, cap in CONFIGS.items():  # alternated: the host's load falls on both
                results[name].append(run_once(script, cap, args.width, args.port))
            print(
                f"rep {rep + 1}: " + ", ".join(f"{n}: {v[-1]:.1f} ms" for n, v in results.items())
            )
    for name, values in results.items():
        print(f"{name:28s} median {statistics.median(values):7.2f} ms  "
              f"min {min(values):7.2f}  max {max(values):7.2f}  (n={len(values)})")  # fmt: skip
    a, b = (statistics.median(v) for v in results.values())
    print(f"overlap gives back {a - b:+.2f} ms per step ({(a - b) / a:+.1%} of the step)")


if __name__ == "__main__":
    main()
