"""Cut a recorded Kineto trace down to a few ProfilerSteps, for a small test fixture.

    python tools/trim_trace.py IN.json[.gz] OUT.json.gz --steps 2 [--drop-flows]

Keeps the file's top-level metadata (deviceProperties, distributedInfo, ...), the
metadata events ('M'), and the complete events ('X') that start inside the first
``--steps`` ProfilerStep windows of the training thread, plus the GPU events launched
from them (same ``correlation`` as a kept CPU event), so each kept kernel still has its
launch. Nothing is renamed or re-timed: every kept event is byte-for-byte the
recorded one. ``--drop-flows`` also drops flow ('s'/'f') and instant ('i') events,
which gpudiag does not read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

_STEP = re.compile(r"^ProfilerStep#\d+$")


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    return {"traceEvents": doc} if isinstance(doc, list) else doc


def trim(doc: dict, steps: int, drop_flows: bool) -> dict:
    events = doc["traceEvents"]
    marks = sorted(
        (e for e in events if e.get("ph") == "X" and _STEP.match(str(e.get("name", "")))),
        key=lambda e: e["ts"],
    )[:steps]
    if not marks:
        raise SystemExit("no ProfilerStep in the trace")
    lo, hi = marks[0]["ts"], marks[-1]["ts"] + marks[-1]["dur"]
    cpu_corr = set()
    keep = []
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            keep.append(e)
            continue
        if drop_flows and ph in ("s", "f", "i", "I"):
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or not lo <= ts < hi:
            continue
        keep.append(e)
        args = e.get("args") or {}
        if "stream" not in args and "correlation" in args:
            cpu_corr.add(args["correlation"])
    kept = {id(e) for e in keep}
    for e in events:  # GPU work launched in the window that ran after it
        args = e.get("args") or {}
        if (
            id(e) not in kept
            and e.get("ph") == "X"
            and "stream" in args
            and args.get("correlation") in cpu_corr
        ):
            keep.append(e)
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["traceEvents"] = keep
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--drop-flows", action="store_true")
    a = p.parse_args()
    data = json.dumps(trim(_load(a.src), a.steps, a.drop_flows)).encode()
    a.dst.write_bytes(gzip.compress(data, 9, mtime=0))
    print(f"{a.dst}: {a.dst.stat().st_size} bytes")


if __name__ == "__main__":
    main()
