"""Evidence for docs/reliability.md: each failure of a traced job, and bad input to
`gpudiag analyze`, run for real (2-rank gloo DDP on CPU), with what gpudiag recorded.

    python bench/reliability.py [--hang-timeout 5]

Prints one Markdown table row per scenario: what happened, how long detection took, the
status and exit code gpudiag reported, what the run directory kept and what
`gpudiag analyze` says first. The same behaviours are asserted by the tests named in
docs/reliability.md; this script measures them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DDP_SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
TRACES = REPO.parent / "shared" / "traces" / "param_dlrm_ddp8"

DESYNC_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1000)
for _ in range(3):
    dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.all_reduce(t)          # rank 0: all_reduce at this seq
else:
    dist.broadcast(t, src=0)    # rank 1: broadcast at the same seq
"""


def trace_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint", *args]


def summarise(out: Path) -> dict:
    from gpudiag import analyze, load_run

    run = load_run(out)
    steps = run.steps.groupby("rank").size().to_dict() if len(run.steps) else {}
    m = run.manifest
    first = None
    try:
        res = analyze(out)
        if res.findings:
            f = res.findings[0]
            first = f"{f.kind} ({f.severity}) ranks {f.ranks}: {f.title}"
    except Exception as exc:  # noqa: BLE001 - evidence, not a crash
        first = f"analyze failed: {type(exc).__name__}: {exc}"
    return {
        "status": m.get("status"),
        "exit_code": m.get("exit_code"),
        "failed_ranks": m.get("failed_ranks"),
        "exc": (m.get("failure") or {}).get("exc_type"),
        "steps_kept": {int(k): int(v) for k, v in steps.items()},
        "first_finding": first,
        "hang": run.hang_report,
    }


def run_to_end(cmd: list[str], cwd: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    return proc.returncode, time.monotonic() - t0


def signal_mid_run(cmd: list[str], cwd: Path, signum: int, after_s: float) -> tuple[int, float]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after_s)
    t0 = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(timeout=120)
    return code, time.monotonic() - t0


def row(name: str, code: int, seconds: float, s: dict, extra: str = "") -> str:
    kept = ", ".join(f"rank {r}: {n} steps" for r, n in sorted(s["steps_kept"].items()))
    return (
        f"| {name} | exit {code} in {seconds:.1f} s | {s['status']} (exit_code {s['exit_code']}, "
        f"failed {s['failed_ranks']}{', ' + s['exc'] if s['exc'] else ''}) | {kept or 'none'} "
        f"| {s['first_finding']} | {extra} |"
    )


def failures(tmp: Path, hang_timeout: float) -> Iterator[str]:
    ddp = ["--nproc-per-node", "2", "--standalone", str(DDP_SCRIPT)]
    out = tmp / "crash"
    code, sec = run_to_end(trace_cmd(out, *ddp, "--steps", "12", "--crash-rank", "1",
                                     "--crash-step", "5"), tmp)  # fmt: skip
    yield row("rank 1 raises at step 5", code, sec, summarise(out))

    for name, signum in (("SIGTERM", signal.SIGTERM), ("Ctrl-C (SIGINT)", signal.SIGINT)):
        out = tmp / name.split()[0].lower()
        code, sec = signal_mid_run(
            trace_cmd(out, *ddp, "--steps", "200", "--sleep", "0.05"), tmp, signum, 8.0
        )
        yield row(f"{name} to gpudiag mid-run", code, sec, summarise(out),
                  "seconds = signal to exit")  # fmt: skip

    out = tmp / "hang"
    code, sec = run_to_end(trace_cmd(out, "--hang-timeout", str(hang_timeout), *ddp, "--steps",
                                     "12", "--hang-rank", "1", "--hang-step", "4"), tmp)  # fmt: skip
    s = summarise(out)
    hang = s["hang"] or {}
    yield row(f"rank 1 hangs at step 4 (--hang-timeout {hang_timeout:g})", code, sec, s,
                    f"detected after {hang.get('detected_after_s', float('nan')):.2f} s: "
              f"{hang.get('verdict')}")  # fmt: skip

    script = tmp / "desync.py"
    script.write_text(DESYNC_SCRIPT)
    out = tmp / "desync"
    code, sec = run_to_end(trace_cmd(out, "--hang-timeout", str(hang_timeout),
                                     "--nproc-per-node", "2", "--standalone", str(script)), tmp)  # fmt: skip
    s = summarise(out)
    hang = s["hang"] or {}
    yield row("rank 0 all_reduce, rank 1 broadcast at the same seq", code, sec, s,
                    f"detected after {hang.get('detected_after_s', float('nan')):.2f} s: "
              f"{hang.get('verdict')}")  # fmt: skip


def bad_input(tmp: Path) -> list[str]:
    """A trace directory holding real traces plus one broken file of each kind."""
    d = tmp / "bad_input"
    shutil.copytree(TRACES, d)
    good = sorted(d.glob("*.json.gz"))
    raw = gzip.decompress(good[0].read_bytes())
    (d / "worker90.pt.trace.json.gz").write_bytes(gzip.compress(raw)[: len(raw) // 50])
    (d / "worker91.pt.trace.json").write_bytes(raw[: len(raw) // 3])
    (d / "worker92.pt.trace.json").write_bytes(b"")
    (d / "worker93.pt.trace.json").write_text(json.dumps({"hello": "not a trace"}))
    good[1].unlink()  # a missing rank
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(d), "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    sec = time.monotonic() - t0
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    warnings = [w for w in proc.stderr.splitlines() if w.strip()]
    ranks = [r["rank"] for r in result.get("ranks", [])]
    lines = [
        f"| bad input: truncated gzip, truncated JSON, empty file, non-trace JSON, a missing "
        f"rank, among 7 real traces | exit {proc.returncode} in {sec:.1f} s | "
        f"{len(warnings)} one-line warnings, no traceback: {'Traceback' not in proc.stderr} | "
        f"ranks analysed {ranks} | {len(result.get('findings', []))} findings | |"
    ]
    lines += [f"|  | warning | `{w[:160]}` | | | |" for w in warnings]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hang-timeout", type=float, default=5.0)
    args = p.parse_args()
    print("| scenario | gpudiag | manifest status | data kept | analyze: first finding | notes |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="gpudiag-reliability-") as tmp:
        for line in failures(Path(tmp), args.hang_timeout):
            print(line, flush=True)
        if TRACES.is_dir():
            for line in bad_input(Path(tmp)):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
