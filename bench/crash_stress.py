"""Profiler-safety stress (issue 28): many traced runs of region-using, hook-heavy
scripts on a busy host, counting every run that did not end cleanly.

    python bench/crash_stress.py [--runs 200] [--hogs 2] [--code CHECKOUT] [--compile-every 25]

Each run is `gpudiag trace` (default profiler window) of tests/scripts/region_loop.py
(the issue's script: a region around each step, nothing else) or of
tests/scripts/stress_regions.py, cycling through variants:
one process without a DataLoader; one process; with CPU autocast; with 2 DataLoader workers;
2-rank gloo DDP; 2-rank DDP with a worker and autocast; every --compile-every-th run with
torch.compile. --hogs CPU-bound processes run beside it the whole time (killed at the
end). A run is clean when gpudiag exits 0, every rank wrote a trace and the manifest says
`ok`; anything else is printed with its exit code and the first line of stacks.txt.
--code runs the gpudiag of another checkout (e.g. a `git worktree` of an older commit),
so before/after can be measured the same way. Prints one Markdown row per variant and
the total.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "stress_regions.py"
ISSUE_SCRIPT = REPO / "tests" / "scripts" / "region_loop.py"
VARIANTS: dict[str, tuple[list[str], list[str]]] = {
    "the issue's loop (region_loop.py)": ([], []),
    "1 process, no DataLoader": ([], ["--no-loader"]),
    "1 process": ([], []),
    "1 process, autocast": ([], ["--amp"]),
    "1 process, 2 loader workers": ([], ["--workers", "2"]),
    "DDP 2 ranks": (["--nproc-per-node", "2"], []),
    "DDP 2 ranks, loader worker, autocast": (
        ["--nproc-per-node", "2"],
        ["--workers", "1", "--amp"],
    ),
}
COMPILED = "1 process, torch.compile"
RUN_TIMEOUT_S = 600


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def run_once(
    code: Path, out: Path, launch: list[str], script: Path, script_args: list[str]
) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--out", str(out), *launch]
    cmd += [str(script), *script_args]
    try:
        # cwd outside any checkout: `python -m` puts the cwd first on sys.path
        proc = subprocess.run(
            cmd, env=env, cwd=out.parent, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return False, "timed out"
    manifest = out / "manifest.json"
    status = json.loads(manifest.read_text()).get("status") if manifest.is_file() else None
    world = 2 if launch else 1
    traces = sorted((out / "traces").glob("rank*.pt.trace.json.gz"))
    if proc.returncode == 0 and status == "ok" and len(traces) == world:
        return True, ""
    stacks = sorted(out.glob("rank*/stacks.txt"))
    first = stacks[0].read_text(errors="replace").splitlines()[:1] if stacks else []
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
    return False, f"exit {proc.returncode}, status {status}, traces {len(traces)}: {first or tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose gpudiag runs")
    ap.add_argument("--compile-every", type=int, default=25, help="0: never")
    ap.add_argument("--only", choices=sorted(VARIANTS), help="run this variant only")
    args = ap.parse_args()
    names = [args.only] if args.only else list(VARIANTS)
    plan = []
    for i in range(args.runs):
        if args.compile_every and i % args.compile_every == args.compile_every - 1:
            plan.append((COMPILED, [], ["--compile"]))
        else:
            name = names[i % len(names)]
            plan.append((name, *VARIANTS[name]))
    runs: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    scratch = Path(tempfile.mkdtemp(prefix="gpudiag-stress-"))
    hogs = start_hogs(args.hogs)
    t0 = time.monotonic()
    try:
        for i, (name, launch, script_args) in enumerate(plan):
            script = ISSUE_SCRIPT if name.startswith("the issue's loop") else SCRIPT
            ok, why = run_once(args.code, scratch / f"run{i}", launch, script, script_args)
            runs[name] += 1
            if not ok:
                bad[name] += 1
                print(f"run {i} ({name}): NOT CLEAN: {why}", flush=True)
            shutil.rmtree(scratch / f"run{i}", ignore_errors=True)
            if (i + 1) % 20 == 0:
                print(f"... {i + 1} runs, {sum(bad.values())} not clean", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\ncode: {args.code}; {args.hogs} CPU hogs; {time.monotonic() - t0:.0f} s\n")
    print("| variant | runs | not clean |\n|---|---|---|")
    for name in [*names, COMPILED]:
        if runs[name]:
            print(f"| {name} | {runs[name]} | {bad[name]} |")
    print(f"| **all** | {sum(runs.values())} | {sum(bad.values())} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
