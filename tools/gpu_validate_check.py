"""Checks the run directories recorded by tools/gpu_validate.sh and prints a verdict.

    python tools/gpu_validate_check.py OUT_DIR

Each check is (name, ok, detail). ``check_run`` works on any run directory, so the
CPU test suite exercises it on CPU runs (where the GPU checks must fail).
"""

from __future__ import annotations

import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpudiag import rundir  # noqa: E402

MAX_RUN_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class Expect:
    ranks: int
    backend: str | None = None
    nvml: bool = True
    cuda_kernels: bool = True
    nccl: bool = False
    collectives: bool = False
    data_parallel: bool = False


# run name (as written by gpu_validate.sh) -> what it must contain
EXPECTED: dict[str, Expect] = {
    "single_gpu": Expect(ranks=1),
    "ddp_nccl_ws1": Expect(ranks=1, backend="nccl", nccl=True, collectives=True),
    "gloo_cuda_2rank": Expect(ranks=2, backend="gloo", collectives=True),
    "dp_two_replicas_one_gpu": Expect(ranks=1, data_parallel=True),
}

Check = tuple[str, bool, str]


def _trace_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rb") as fh:
        return [e for e in json.loads(fh.read()).get("traceEvents", []) if isinstance(e, dict)]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_run(path: Path, expect: Expect) -> list[Check]:
    run = rundir.load_run(path)
    m = run.manifest
    checks: list[Check] = [
        (
            "status ok",
            m.get("status") == "ok",
            f"status={m.get('status')} exit={m.get('exit_code')}",
        ),
        (
            "ranks",
            sorted(run.statuses) == list(range(expect.ranks)),
            f"ranks={sorted(run.statuses)}",
        ),
        ("steps recorded", len(run.steps) > 0, f"{len(run.steps)} step rows"),
        (
            "traces",
            sorted(run.trace_files) == list(range(expect.ranks)),
            f"{sorted(run.trace_files)}",
        ),
        ("size <= 2 MB", _dir_bytes(path) <= MAX_RUN_BYTES, f"{_dir_bytes(path) / 1e6:.2f} MB"),
    ]
    if expect.backend:
        checks.append(
            ("backend", m.get("backend") == expect.backend, f"backend={m.get('backend')}")
        )
    if expect.nvml:
        util = run.gpu_samples.get("util_gpu") if len(run.gpu_samples) else None
        good = util is not None and util.notna().any()
        checks.append(
            ("NVML samples", bool(good), f"{len(run.gpu_samples)} rows, sampler={m.get('sampler')}")
        )
    events = {r: _trace_events(p) for r, p in run.trace_files.items()}
    if expect.cuda_kernels:
        kernels = {r: sum(e.get("cat") == "kernel" for e in ev) for r, ev in events.items()}
        ok = bool(kernels) and all(kernels.values())
        checks.append(("CUDA kernels in trace", ok, f"kernels per rank {kernels}"))
    if expect.collectives:
        per_rank = run.collectives.groupby("rank").size().to_dict() if len(run.collectives) else {}
        ok = sorted(per_rank) == list(range(expect.ranks))
        checks.append(("collectives recorded", ok, f"rows per rank {per_rank}"))
    if expect.nccl:
        # NCCL with one rank launches no kernel (seen on an H200): its calls are checked in
        # the trace's annotations and, with their GPU times, in the Flight Recorder rows
        calls = {
            r: sum(str(e.get("name", "")).startswith("nccl:") for e in ev)
            for r, ev in events.items()
        }
        checks.append(("NCCL calls in trace", bool(calls) and all(calls.values()), f"{calls}"))
        coll = run.collectives
        column = "gpu_duration_ns"  # FR's duration_ms (CUDA events): TORCH_NCCL_ENABLE_TIMING
        timed = int(coll[column].notna().sum()) if len(coll) and column in coll.columns else 0
        checks.append(
            ("NCCL times from the Flight Recorder", timed > 0, f"{timed} of {len(coll)} rows")
        )
    if expect.data_parallel:
        all_events = [e for ev in events.values() for e in ev]
        names = {str(e.get("name", "")) for e in all_events}
        wanted = ["DataParallel.forward", "Broadcast", "ReduceAddCoalesced", "Gather", "Scatter"]
        found = [w for w in wanted if any(w in n for n in names)]
        # parallel_apply runs one Python thread per replica. The profiler records none of
        # their ops, only their kernel launches (seen on an H200, torch 2.11): two threads
        # other than the one of DataParallel.forward launch kernels
        dp_threads = {e.get("tid") for e in all_events if e.get("name") == "DataParallel.forward"}
        threads = {
            e.get("tid")
            for e in all_events
            if e.get("cat") == "cuda_runtime"
            and "LaunchKernel" in str(e.get("name"))
            and e.get("tid") not in dp_threads
            and e.get("tid") != 0
        }
        threads -= {e.get("tid") for e in all_events if e.get("cat") == "cpu_op"}
        ok = "DataParallel.forward" in found and len(threads) >= 2
        checks.append(
            ("DataParallel replicas", ok, f"found {found}; {len(threads)} replica threads")
        )
    return checks


def verdict(out: Path) -> int:
    failures = 0
    for name, expect in EXPECTED.items():
        path = out / name
        log = out / f"{name}.log"
        log_text = log.read_text(errors="replace") if log.exists() else ""
        print(f"== {name}")
        if "DP_REJECTED" in log_text:
            reason = next(line for line in log_text.splitlines() if "DP_REJECTED" in line)
            print(f"   torch does not accept nn.DataParallel(device_ids=[0, 0]): {reason[12:]}")
            continue
        if not rundir.is_run_dir(path):
            print(f"   FAIL no run directory (see {log})")
            failures += 1
            continue
        for check, ok, detail in check_run(path, expect):
            print(f"   {'ok  ' if ok else 'FAIL'} {check}: {detail}")
            failures += not ok
    print(
        f"\nGPU validation: {'PASS' if failures == 0 else f'FAIL ({failures} check(s))'}; run dirs in {out}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: gpu_validate_check.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(verdict(Path(sys.argv[1])))
