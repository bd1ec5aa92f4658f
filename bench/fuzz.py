"""The full mutation fuzzer over every input `gpudiag analyze` reads (issue 16 item 11).

    python bench/fuzz.py [--cases 10000] [--seed 0] [--scratch DIR]

Each case damages one file of a small real input (see tests/fuzz_inputs.py), analyses
it through the CLI in-process (terminal, --json or --html output), and counts cases
whose exception escaped (a traceback), grouped by crash site; also exit codes. A case
whose file was replaced by what no reader should read (/dev/zero, a FIFO, a socket, an
unreadable file or directory) runs in a subprocess with a timeout and a memory limit: a
hang or an unbounded read is a crash site too. Prints per input kind the number of
cases, how many ran isolated, and the crash sites with an example seed.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fuzz_inputs import KINDS, make_bases, mutate_case, needs_isolation, run_case  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args(argv)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="gpudiag-fuzz-"))
    bases = make_bases(scratch)
    per_kind: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    sites: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    isolated = 0  # cases run in a subprocess (an unusable file: see fuzz_inputs.UNUSABLE)
    t0 = time.perf_counter()
    for i in range(args.cases):
        seed = args.seed + i
        kind = KINDS[seed % len(KINDS)]
        mode = ("json", "terminal", "json", "terminal", "html")[(seed // len(KINDS)) % 5]
        if mode == "html" and (seed // len(KINDS)) % 25:
            mode = "json"  # HTML (plotly) is slow: every 25th round only
        try:
            path = mutate_case(bases, scratch / "case", kind, seed)
        except Exception as exc:  # noqa: BLE001 - a defect of the mutator, not of gpudiag
            print(f"mutator failed on kind {kind} seed {seed}: {exc!r}", flush=True)
            codes["mutator error"] += 1
            continue
        isolated += any(needs_isolation(path))
        code, site, _ = run_case(path, mode, scratch / "out.html")
        per_kind[kind] += 1
        codes[str(code)] += 1
        if site:
            sites[site].append((kind, seed))
        if site:
            print(f"traceback at {site} (kind {kind}, seed {seed}, {mode})", flush=True)
        if (i + 1) % 100 == 0:
            crashes = sum(len(v) for v in sites.values())
            print(
                f"{i + 1} cases, {crashes} tracebacks, {time.perf_counter() - t0:.0f} s, "
                f"exit codes {dict(codes)}",
                flush=True,
            )
    crashes = sum(len(v) for v in sites.values())
    print(f"\n{args.cases} mutated inputs over {len(KINDS)} input kinds, seeds {args.seed}..")
    print(f"{args.seed + args.cases - 1}; {time.perf_counter() - t0:.0f} s")
    print("exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    print(f"tracebacks: {crashes} at {len(sites)} crash site(s)")
    print(f"isolated (an unusable file, in a subprocess with a timeout): {isolated} case(s)")
    for site, hits in sorted(sites.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(hits):>5}  {site}  e.g. kind {hits[0][0]} seed {hits[0][1]}")
    print("cases per kind: " + ", ".join(f"{k} {v}" for k, v in per_kind.items()))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
