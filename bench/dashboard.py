"""First paint of the dashboard on an 8-rank run, in headless Chromium.

    python bench/dashboard.py [--traces ../shared/traces] [--repeat 3]

Starts the real `gpudiag dashboard` on a free port and measures, per 8-rank run, the
seconds from navigation to the run's first content (the view's header or the run's
facts) and to the first chart drawn (the Overview's inline SVG, else plotly's
`.js-plotly-plot .main-svg`), which is the
figure held against the 3 s target: cold (the run analysed for the first time in this
server), warm (a new browser session; the analysis comes from the content-keyed cache),
for the Overview and the Timeline, and the first view in a brand-new browser profile of
a server started 10 s earlier. Prints the chart figure beside the target as a ratio
(≤ 1.00 meets it).

Side by side (`--side-by-side`, also run at the end of the full bench): the time to the
first chart of the dashboard's Overview against a plain Streamlit page with one plotly
chart, both servers warm, each navigation in a brand-new browser profile (nothing
cached), the two alternated in one run so they share the machine's load; the ratio of
the medians is held against 1.3.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.browser import dashboard as browser  # noqa: E402

TARGET_S = 3.0
RUNS = ("astrasim_megatron_tp8", "param_dlrm_ddp8")


Row = tuple[str, str, float, float]  # run, what, first content s, first chart s


def measure(traces: Path, repeat: int) -> list[Row]:
    rows: list[Row] = []
    server = browser.Dashboard([traces])
    try:
        server.wait_ready()
        with browser.browser() as page:
            # the very first navigation: a fresh browser loads Streamlit's scripts, and the
            # server's start-up prewarm (dashboards/serve.py) may still be analysing
            for run in RUNS:
                label = f"{traces.name}/{run}"
                cold = browser.paint_times_s(page, browser.view_url(server.url, label, "Overview"))
                rows.append((run, "Overview, cold (analysis included)", *cold))
                for view in ("Overview", "Timeline"):
                    times = [
                        browser.paint_times_s(page, browser.view_url(server.url, label, view))
                        for _ in range(repeat)
                    ]
                    content = statistics.median(t[0] for t in times)
                    chart = statistics.median(t[1] for t in times)
                    rows.append((run, f"{view}, warm (median of {repeat})", content, chart))
    finally:
        server.close()
    rows += _settled(traces)
    return rows


def _settled(traces: Path, settle_s: float = 10.0) -> list[Row]:
    """First view in a fresh browser of a server started settle_s earlier: what a user
    who opens the printed URL a few seconds after `gpudiag dashboard` sees."""
    rows: list[Row] = []
    server = browser.Dashboard([traces])
    try:
        server.wait_ready()
        time.sleep(settle_s)
        with browser.browser() as page:
            for run in RUNS:
                url = browser.view_url(server.url, f"{traces.name}/{run}", "Overview")
                what = f"Overview, first view {settle_s:.0f} s after start"
                rows.append((run, what, *browser.paint_times_s(page, url)))
    finally:
        server.close()
    return rows


PLAIN_APP = """
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="plain", layout="wide")
st.header("Plain page")
st.plotly_chart(go.Figure(go.Bar(x=["rank 0", "rank 1", "rank 2", "rank 3"], y=[53, 54, 57, 60])))
"""
SIDE_BY_SIDE_TARGET = 1.3


class PlainPage:
    """`streamlit run` of a page with one plotly chart and nothing else."""

    def __init__(self, folder: Path) -> None:
        app = folder / "plain_app.py"
        app.write_text(PLAIN_APP)
        self.port = browser.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true",
             "--server.port", str(self.port), "--browser.gatherUsageStats", "false"],
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=1) as resp:
                    if resp.read().strip() == b"ok":
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("plain streamlit page not healthy")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.output.close()


def _fresh_chart_s(url: str, selector: str) -> float:
    """Seconds from navigation to the first chart, in a brand-new browser profile."""
    with browser.browser() as page:
        page.set_viewport_size({"width": 1440, "height": 900})
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_selector(selector, timeout=120_000)
        return time.perf_counter() - start


def side_by_side(run: Path, repeat: int) -> tuple[list[float], list[float]]:
    """(dashboard s, plain page s) to the first chart, alternated, warm servers."""
    dash_s: list[float] = []
    plain_s: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        server = browser.Dashboard([run])
        plain = PlainPage(Path(folder))
        try:
            server.wait_ready()
            plain.wait_ready()
            dash_url = browser.view_url(server.url, run.name, "Overview")
            # warm both servers (analysis cached, imports done) before the clock
            _fresh_chart_s(dash_url, browser.FIRST_CHART)
            _fresh_chart_s(plain.url, browser.PLOTLY)
            for _ in range(repeat):
                dash_s.append(_fresh_chart_s(dash_url, browser.FIRST_CHART))
                plain_s.append(_fresh_chart_s(plain.url, browser.PLOTLY))
        finally:
            server.close()
            plain.close()
    return dash_s, plain_s


def print_side_by_side(run: Path, repeat: int) -> float:
    dash_s, plain_s = side_by_side(run, repeat)
    ratio = statistics.median(dash_s) / statistics.median(plain_s)
    print(f"side by side, {run.name}, fresh browser profile each, warm servers, {repeat} pairs:")
    print(f"  dashboard Overview first chart s: {' '.join(f'{v:.2f}' for v in dash_s)}")
    print(f"  plain page, one plotly chart s:   {' '.join(f'{v:.2f}' for v in plain_s)}")
    print(
        f"  ratio of medians {ratio:.2f} (target ≤ {SIDE_BY_SIDE_TARGET}); "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--side-by-side",
        type=Path,
        nargs="?",
        const=REPO / "sample_runs" / "ddp4_straggler",
        help="only the side-by-side measure, on this run (default: the straggler sample)",
    )
    args = parser.parse_args()
    if args.side_by_side is not None:
        print_side_by_side(args.side_by_side.resolve(), max(args.repeat, 5))
        return 0
    missing = [r for r in RUNS if not (args.traces / r).is_dir()]
    if missing:
        print(f"bench/dashboard.py: {args.traces}: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = measure(args.traces.resolve(), args.repeat)
    head = f"{'run':<24} {'what':<38} {'content s':>9} {'chart s':>8} {'target s':>9} {'ratio':>6}"
    print(head)
    for run, what, content, chart in rows:
        print(
            f"{run:<24} {what:<38} {content:>9.2f} {chart:>8.2f} {TARGET_S:>9.1f} "
            f"{chart / TARGET_S:>6.2f}"
        )
    print_side_by_side(REPO / "sample_runs" / "ddp4_straggler", max(args.repeat, 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
