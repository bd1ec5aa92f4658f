"""First paint of the dashboard on an 8-rank run, in headless Chromium.

    python bench/dashboard.py [--traces ../shared/traces] [--repeat 3]

Starts the real `gpudiag dashboard` on a free port and measures, per 8-rank run, the
seconds from navigation to the run's first content (the view's header or the run's
facts) and to the first plotly chart drawn (`.js-plotly-plot .main-svg`), which is the
figure held against the 3 s target: cold (the run analysed for the first time in this
server), warm (a new browser session; the analysis comes from the content-keyed cache),
for the Overview and the Timeline, and the first view in a brand-new browser profile of
a server started 10 s earlier. Prints the chart figure beside the target as a ratio
(≤ 1.00 meets it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
