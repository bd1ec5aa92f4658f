"""Server memory of the dashboard while browser sessions open a run with a large trace.

    python bench/dashboard_memory.py [--trace-mb 100] [--sessions 20]

Builds a run in a temporary folder from sample_runs/ddp2_healthy whose rank-0 trace is
that run's real recorded trace, uncompressed, with one padding string added at its top
level (``gpudiag_bench_padding``) to reach --trace-mb (the analysis reads the events as
recorded; the file is as large as a long profile). Starts the real `gpudiag dashboard`,
then opens the run's Overview (which offers the trace for download) in --sessions
sequential browser sessions: a new tab each, opened once the previous one has drawn,
all left open. Prints the Streamlit server's resident memory (VmRSS of the server process
and its children) before the first session and after each, and the growth per session.
Run it from the checkout whose dashboard is measured (PYTHONPATH=that checkout).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.browser import dashboard as browser  # noqa: E402

SOURCE_RUN = REPO / "sample_runs" / "ddp2_healthy"
DOWNLOAD = '[data-testid="stDownloadButton"]'


def build_run(root: Path, trace_mb: int) -> Path:
    run = root / "big_trace_run"
    shutil.copytree(SOURCE_RUN, run)
    gz = run / "traces" / "rank0.pt.trace.json.gz"
    data = json.loads(gzip.decompress(gz.read_bytes()))
    body = json.dumps(data).encode()
    pad = max(0, trace_mb * 10**6 - len(body) - 40)
    data["gpudiag_bench_padding"] = "x" * pad
    (run / "traces" / "rank0.pt.trace.json").write_text(json.dumps(data))
    gz.unlink()
    return run


def server_rss_mb(cli_pid: int) -> float:
    """Resident memory of the CLI's children (the Streamlit server), MB."""
    total = 0
    for child in psutil.Process(cli_pid).children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total / 1e6


def sessions(url: str, run_label: str, n: int, cli_pid: int) -> list[float]:
    """Server RSS before the first session and after each: every session is a new page
    (its own Streamlit session) opened once the previous one has drawn its Overview, and
    left open, as reviewers' tabs are."""
    rss = [server_rss_mb(cli_pid)]
    with browser.browser() as first:
        context = first.context
        for i in range(n):
            page = first if i == 0 else context.new_page()
            start = time.perf_counter()
            page.goto(browser.view_url(url, run_label, "Overview"))
            page.wait_for_selector(DOWNLOAD, timeout=300_000)
            browser.wait_idle(page, 300_000)
            time.sleep(1.0)
            rss.append(server_rss_mb(cli_pid))
            print(
                f"session {i + 1}: {time.perf_counter() - start:.1f} s, server {rss[-1]:.0f} MB",
                flush=True,
            )
    return rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-mb", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = build_run(root, args.trace_mb)
        size = (run / "traces" / "rank0.pt.trace.json").stat().st_size
        print(f"run {run.name}: rank-0 trace {size / 1e6:.1f} MB")
        server = browser.Dashboard([root])
        try:
            server.wait_ready(timeout_s=300)
            label = f"{root.name}/{run.name}"
            rss = sessions(server.url, label, args.sessions, server.proc.pid)
        finally:
            server.close()
    growth = [b - a for a, b in zip(rss[1:], rss[2:], strict=False)]
    print("server RSS MB per session: " + " ".join(f"{v:.0f}" for v in rss))
    print(
        f"after first session {rss[1]:.0f} MB, after {args.sessions} sessions {rss[-1]:.0f} MB; "
        f"growth per later session median {statistics.median(growth):.1f} MB "
        f"(min {min(growth):.1f}, max {max(growth):.1f})"
        if growth
        else "too few sessions for a growth figure"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
