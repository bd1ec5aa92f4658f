"""Cost of the dashboard's live mode per refresh on a long, wide run: 64 ranks, 1 million
step rows (the SYNTHESISED run directory of bench/live.py, marked running by a live
launcher: this process).

The app is driven with Streamlit's AppTest, in this process: each `at.run()` is a whole
script run (run discovery, the live check, the live panel: one LiveMonitor refresh and
the rendering of the 64-rank table), an upper bound of what the browser's 2 s fragment
rerun costs (that reruns only the panel). Before each refresh one second of training is
appended to every rank (--append-steps steps and their collectives). Measured with
time.process_time (CPU, all threads of the process) and wall clock, and RSS (psutil).
Flat means CPU per refresh and RSS do not grow with the refresh count.

    python bench/dashboard_live.py [--refreshes 30] [--append-steps 20] [--coll-steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from live import RANKS, STEP_ROWS, Source, _rss, _spread, synthesise  # noqa: E402

from gpudiag import rundir  # noqa: E402

APP = REPO / "dashboards" / "app.py"


def _mark_running(run: Path) -> None:
    path = run / rundir.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["launcher"] = {"pid": os.getpid(), "hostname": socket.gethostname()}
    path.write_text(json.dumps(manifest))


def _append(run: Path, src: Source, first: int, count: int) -> None:
    for r in range(RANKS):
        d = rundir.rank_dir(run, r)
        with open(rundir.table_path(d, "steps"), "a") as fh:
            fh.write(src.step_lines(r, first, count))
        with open(rundir.table_path(d, "collectives"), "a") as fh:
            fh.write(src.coll_lines(r, first, count))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--refreshes", type=int, default=30)
    p.add_argument("--append-steps", type=int, default=20)
    p.add_argument("--coll-steps", type=int, default=2000)
    ns = p.parse_args()
    from streamlit.testing.v1 import AppTest

    from dashboards import live_page as dash_live

    print(
        "SYNTHESISED run directory: rows of the real sample_runs/ddp4_straggler "
        f"replicated to {RANKS} ranks (bench/live.py), marked running."
    )
    src = Source()
    root = Path(tempfile.mkdtemp(prefix="gpudiag-bench-dashlive-"))
    try:
        steps = STEP_ROWS // RANKS
        run = synthesise(root, src, steps, ns.coll_steps)
        _mark_running(run)
        sys.argv = ["app.py", str(root)]
        at = AppTest.from_file(str(APP), default_timeout=600)
        c0, w0 = time.process_time(), time.perf_counter()
        at.run()
        first_cpu, first_wall = (time.process_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3
        assert not at.exception, [e.value for e in at.exception]
        assert at.header[0].value.startswith("Live"), at.header[0].value
        rss_first = _rss()
        print(
            f"first script run (imports, reader from nothing): CPU {first_cpu:.0f} ms, wall {first_wall:.0f} ms"
        )
        next_step = steps + 1
        cpu_ms, wall_ms, rss = [], [], []
        for _ in range(ns.refreshes):
            _append(run, src, next_step, ns.append_steps)
            next_step += ns.append_steps
            time.sleep(dash_live.MIN_POLL_S)  # a fresh read each time, not the shared one
            c0, w0 = time.process_time(), time.perf_counter()
            at.run()
            cpu_ms.append((time.process_time() - c0) * 1e3)
            wall_ms.append((time.perf_counter() - w0) * 1e3)
            rss.append(_rss())
        shown = next(m.value for m in at.metric if m.label == "Newest step")
        lagging = next(m.value for m in at.metric if m.label == "Lagging ranks")
        half = len(cpu_ms) // 2
        print(
            f"refreshes ({ns.refreshes}, each after {ns.append_steps} new steps per rank "
            f"= {ns.append_steps * RANKS} step rows):"
        )
        print(f"  CPU ms, all:         {_spread(cpu_ms)}")
        print(f"  CPU ms, first half:  {_spread(cpu_ms[:half])}")
        print(f"  CPU ms, second half: {_spread(cpu_ms[half:])}")
        print(f"  wall ms, all:        {_spread(wall_ms)}")
        print(
            f"  RSS MiB: after the first run {rss_first / 2**20:.0f}, after refresh {half} "
            f"{rss[half - 1] / 2**20:.0f}, after the last {rss[-1] / 2**20:.0f}"
        )
        print(f"  page shows: newest step {shown} (expected {next_step - 1}), lagging {lagging}")
        print(f"load average: {os.getloadavg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
