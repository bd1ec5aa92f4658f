"""Screenshots of every dashboard view at 1440x900 in headless Chromium.

    python bench/dashboard_shots.py OUT_DIR [--run sample_runs/ddp4_straggler ...]

Starts the real `gpudiag dashboard` on the runs given (default: the straggler sample,
two public GPU sets under ../shared/traces and a copy of the straggler sample marked
live, i.e. still being written by a launcher that is alive: a `sleep` this script
starts and ends) and, for each run and view, saves `<run>__<view>.png` (the first
screen, what a user sees without scrolling) and `<run>__<view>__full.png` (the page).
Nothing is written into the repository: the live copy lives in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dashboards import runs as dash_runs  # noqa: E402
from dashboards import views as dash_views  # noqa: E402
from tests.browser import dashboard as browser  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
DEFAULT_RUNS = (
    REPO / "sample_runs" / "ddp4_straggler",
    TRACES / "param_dlrm_ddp8",
    TRACES / "astrasim_megatron_tp8",
)
WIDTH, HEIGHT = 1440, 900


def live_copy(root: Path, sample: Path, pid: int) -> Path:
    """`sample` (without its traces) as `gpudiag trace` leaves it while the job runs."""
    run = root / "live_run"
    shutil.copytree(sample, run, ignore=shutil.ignore_patterns("traces"))
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(status="running", end_ns=None, exit_code=None)
    manifest["launcher"] = {"pid": pid, "hostname": socket.gethostname()}
    path.write_text(json.dumps(manifest))
    for status in run.glob("rank*/status.json"):
        status.unlink()
    return run


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def shoot(out: Path, runs: list[Path], live: bool, only: list[str] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    taken: list[Path] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpudiag-shots-"))
    sleeper = subprocess.Popen(["sleep", "3600"]) if live else None
    try:
        roots = list(runs)
        if sleeper is not None:
            live_root = tmp / "live"
            live_root.mkdir()
            live_copy(live_root, REPO / "sample_runs" / "ddp4_straggler", sleeper.pid)
            roots.append(live_root)
        refs = dash_runs.discover_runs(roots)
        server = browser.Dashboard(roots)
        try:
            server.wait_ready()
            with browser.browser() as page:
                page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
                for ref in refs:
                    is_live = dash_runs.is_live(ref)
                    views = ["Overview"] if is_live else list(dash_views.VIEWS)
                    for view in [v for v in views if not only or v in only]:
                        page.goto(browser.view_url(server.url, ref.label, view))
                        browser.wait_idle(page, 180_000)
                        try:
                            page.wait_for_selector(browser.PLOTLY, timeout=8_000)
                        except Exception:  # noqa: BLE001 - a view without a chart
                            pass
                        page.wait_for_timeout(600)
                        stem = out / f"{_name(ref.label)}__{_name(view)}"
                        page.screenshot(path=f"{stem}.png")
                        # Streamlit scrolls inside its main section: grow the viewport
                        # to the content's height for the whole page, then put it back
                        tall = page.evaluate(
                            "() => Math.max(...[...document.querySelectorAll('section, div')]"
                            ".map(e => e.scrollHeight))"
                        )
                        page.set_viewport_size({"width": WIDTH, "height": min(int(tall), 12000)})
                        page.wait_for_timeout(800)
                        page.screenshot(path=f"{stem}__full.png")
                        page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
                        errors = page.locator(browser.EXCEPTION).count()
                        print(f"{stem.name}: {'EXCEPTION ' if errors else ''}ok", flush=True)
                        taken.append(stem)
        finally:
            server.close()
    finally:
        if sleeper is not None:
            sleeper.terminate()
            sleeper.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--run", type=Path, action="append")
    parser.add_argument("--no-live", action="store_true")
    parser.add_argument("--view", action="append", help="only these views (default: all)")
    args = parser.parse_args()
    runs = [p.resolve() for p in (args.run or DEFAULT_RUNS)]
    shoot(args.out, runs, live=not args.no_live, only=args.view)
    return 0


if __name__ == "__main__":
    sys.exit(main())
