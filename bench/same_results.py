"""Check: two checkouts of gpudiag give byte-identical `gpudiag analyze --json` output.

Used before/after a change to ingest or the analyses that must not move any number
(issue 16 item 10: the compact event table). Every input is analysed by each checkout in
a subprocess; stdout (the JSON report), stderr and the exit code must be identical.

    python bench/same_results.py --before /tmp/base [--after .] [--extra PATH ...]
    python bench/same_results.py --before . --scheduler local:2   # local pool vs Dask

``--scheduler SPEC``: the --after checkout analyses through a Dask cluster
(`gpudiag analyze --scheduler SPEC`, e.g. local:2 for a LocalCluster of 2 workers); its
JSON must still equal the --before checkout's local-pool JSON (Dask's own log lines on
stderr are left out of the comparison).

Inputs: every set in ../shared/traces (recorded traces, read in place), each of its files
alone, every run of sample_runs/ (bench_cpu's runs too), and any --extra path (e.g. the
large replicated trace bench/memory.py writes, which crosses the parser's chunk limits).
Exit status 1 when any output differs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# "2026-11-30 23:10:45,123 - distributed.core - INFO - ...": Dask's logging, not gpudiag's
DASK_LOG = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - (distributed|tornado|asyncio)\b")
SHARED = REPO.parent / "shared" / "traces"


def inputs(extra: list[Path]) -> list[Path]:
    found: list[Path] = []
    for d in sorted(p for p in SHARED.iterdir() if p.is_dir()):
        found.append(d)
        files = sorted(p for p in d.iterdir() if p.name.endswith((".json", ".json.gz")))
        if len(files) > 1:
            found.extend(files)
    runs = REPO / "sample_runs"
    for d in sorted(runs.iterdir()):
        if d.is_dir() and d.name != "bench_cpu":
            found.append(d)
    bench = runs / "bench_cpu"
    found.extend(
        sorted(p for p in bench.iterdir() if p.is_dir() and p.name not in ("logs", "reports"))
    )
    return found + extra


def analyze(code: Path, path: Path, scheduler: str | None = None) -> tuple[int, bytes, bytes]:
    env = dict(os.environ, PYTHONPATH=str(code), GPUDIAG_MAX_TRACE_BYTES=str(8 << 30))
    more = ["--scheduler", scheduler] if scheduler else []
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(path), "--json", *more],
        env=env,
        cwd=code,  # `python -m` puts the working directory first on sys.path
        capture_output=True,
        timeout=3600,
        check=False,
    )
    err = done.stderr.replace(str(code).encode(), b"<code>")
    if scheduler:  # Dask's own log lines (e.g. "Event loop was unresponsive" under load)
        err = b"".join(line for line in err.splitlines(True) if not DASK_LOG.match(line))
    return done.returncode, done.stdout, err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout to compare against")
    ap.add_argument("--after", type=Path, default=REPO)
    ap.add_argument("--extra", type=Path, nargs="*", default=[])
    ap.add_argument("--scheduler", help="analyse with --after through this Dask scheduler")
    args = ap.parse_args(argv)
    differ = 0
    for path in inputs(args.extra):
        before = analyze(args.before.resolve(), path)
        after = analyze(args.after.resolve(), path, args.scheduler)
        same = before == after
        differ += not same
        what = "identical" if same else "DIFFERENT"
        parts = [
            name
            for name, a, b in zip(("rc", "stdout", "stderr"), before, after, strict=True)
            if a != b
        ]
        detail = "" if same else f" ({', '.join(parts)} differ)"
        print(f"{what:>9}  rc={after[0]}  {len(after[1]):>8} B  {path}{detail}", flush=True)
        if before[2] != after[2]:
            print(
                f"    stderr before: {before[2][-300:]!r}\n    stderr after:  {after[2][-300:]!r}"
            )
    print(f"{differ} input(s) differ" if differ else "all outputs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
