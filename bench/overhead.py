"""Cost of `gpudiag trace --no-profile` on a 2-rank gloo DDP job.

Runs the same job bare (torchrun) and under gpudiag, interleaved A B A B in one
invocation, and prints the ratio of median step times. Step times are measured the same
way in both: the training script (tests/scripts/capture_ddp_mlp.py) times its own steps
(wall clock, and process CPU time, which other load on a shared machine disturbs far
less) and appends them to a file. Target: ratio <= 1.02.

With --control, a second bare run takes the gpudiag slot in every other pair, which
shows the noise floor of this machine (bare/bare should be 1.00).

    python bench/overhead.py [--pairs 6] [--steps 60] [--width 512] [--depth 4] [--control]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
WARMUP_STEPS = 5
METRICS = ("ms", "cpu_ms")


def run_job(
    mode: str, workdir: Path, index: int, args: argparse.Namespace
) -> dict[str, float] | None:
    """Median wall and CPU step time (ms) over both ranks, warm-up steps dropped."""
    times = workdir / f"{mode}-{index}.jsonl"
    script = [str(SCRIPT), "--steps", str(args.steps), "--width", str(args.width),
              "--depth", str(args.depth), "--times", str(times)]  # fmt: skip
    torchrun = ["--nproc-per-node", "2", "--standalone"]
    if mode == "gpudiag":
        cmd = [sys.executable, "-m", "gpudiag", "trace", "--out", str(workdir / f"run-{index}"),
               "--no-profile", "--no-lint", *torchrun, *script]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, *script]
    log = workdir / f"{mode}-{index}.log"
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT, timeout=600)
    if rc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"{mode} run {index} failed (exit {rc.returncode}); its log ends:\n{tail}")
        return None
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    return {m: statistics.median(v for r in rows for v in r[m][WARMUP_STEPS:]) for m in METRICS}


def ratio_line(label: str, a: list[dict[str, float]], b: list[dict[str, float]]) -> str:
    parts = []
    for metric, name in zip(METRICS, ("wall", "cpu"), strict=True):
        ma = statistics.median(x[metric] for x in a)
        mb = statistics.median(x[metric] for x in b)
        per_pair = sorted(y[metric] / x[metric] for x, y in zip(a, b, strict=True))
        spread = f"{per_pair[0]:.3f}..{per_pair[-1]:.3f}"
        parts.append(f"{name} {mb / ma:.3f} ({ma:.2f} vs {mb:.2f} ms; pairs {spread})")
    return f"{label:<22} " + "   ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--control", action="store_true", help="also bare vs bare (noise floor)")
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"bare": [], "gpudiag": [], "bare2": []}
    modes = ("bare", "gpudiag", "bare2") if args.control else ("bare", "gpudiag")
    with tempfile.TemporaryDirectory(prefix="gpudiag-overhead-") as tmp:
        for i in range(args.pairs):
            pair = {mode: run_job(mode, Path(tmp), i, args) for mode in modes}
            if None in pair.values():
                continue  # a failed job is reported above and leaves the pair out
            for mode, result in pair.items():
                results[mode].append(result)
            line = "   ".join(f"{m} {results[m][-1]['ms']:7.2f} ms" for m in modes)
            print(f"pair {i + 1}: {line}", flush=True)
    print()
    print(ratio_line("gpudiag/bare", results["bare"], results["gpudiag"]))
    if args.control:
        print(ratio_line("bare/bare (noise)", results["bare"], results["bare2"]))
    print("target: gpudiag/bare <= 1.02")
    return 0


if __name__ == "__main__":
    sys.exit(main())
