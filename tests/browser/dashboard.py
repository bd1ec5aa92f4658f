"""Start `gpudiag dashboard` on a free port and drive it with headless Chromium.

Used by tests/test_dashboard_browser.py and bench/dashboard.py. Chromium flags from
../shared/FACTS.md; a bare `chromium --screenshot` only captures Streamlit's loading
skeleton, so pages are driven and the plotly SVG is awaited.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("GPUDIAG_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLOTLY = ".js-plotly-plot .main-svg"
# The Overview's per-rank chart is an inline SVG (no chart script to load); the other
# views' charts are plotly's.
FIRST_CHART = f"svg.gpudiag-rank-parts, {PLOTLY}"
EXCEPTION = '[data-testid="stException"]'
RUNNING = '[data-testid="stStatusWidget"]'


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Dashboard:
    """A `gpudiag dashboard` process (the real CLI, as a user starts it)."""

    def __init__(self, runs: list[Path], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpudiag",
                "dashboard",
                *map(str, runs),
                "--port",
                str(self.port),
            ],
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dashboard exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=1) as resp:
                    if resp.read().strip() == b"ok":
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"dashboard not healthy after {timeout_s}s: {self.log()}")

    def log(self) -> str:
        self.output.seek(0)
        return self.output.read().decode(errors="replace")

    def interrupt(self, timeout_s: float = 20.0) -> int:
        """Ctrl-C as a terminal sends it to the CLI; returns the CLI's exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.interrupt()
        self.output.close()


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium page (playwright driving Debian's chromium)."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 2000},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def view_url(base: str, run: str, view: str) -> str:
    return f"{base}/?{urllib.parse.urlencode({'run': run, 'view': view})}"


def wait_idle(page: Any, timeout_ms: int = 60_000) -> None:
    """Until Streamlit has finished the current script run: no running-status widget,
    no skeleton and no stale (greyed, left over from the previous run) element."""
    page.wait_for_selector('[data-testid="stSidebar"]', timeout=timeout_ms)
    page.wait_for_function(
        """() => !document.querySelector('[data-testid="stStatusWidget"]')
              && !document.querySelector('[data-testid="stSkeleton"]')
              && !document.querySelector('[data-stale="true"]')""",
        timeout=timeout_ms,
    )


def open_view(page: Any, view: str, timeout_ms: int = 60_000) -> None:
    """Click a view in the sidebar and wait for its own header. The header must start
    with the view's name (case-sensitive): `:has-text` matches any substring in any
    case, and a run named like "`code`" already matched "Code" in the Overview header."""
    exact = re.compile(rf"^{re.escape(view)}$")
    page.locator('[data-testid="stSidebar"] label').filter(has_text=exact).first.click()
    own_header = re.compile(rf"^{re.escape(view)}( ·|$)")
    page.locator("h2").filter(has_text=own_header).first.wait_for(timeout=timeout_ms)
    wait_idle(page, timeout_ms)


RUN_CONTENT = 'h2, [data-testid="stMetric"]'  # a view's header or the run's facts


def paint_times_s(page: Any, url: str, timeout_ms: int = 60_000) -> tuple[float, float]:
    """Seconds from navigation to the run's first content (a view header or the facts)
    and to the first plotly chart drawn."""
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_selector(RUN_CONTENT, timeout=timeout_ms)
    content = time.perf_counter() - start
    page.wait_for_selector(FIRST_CHART, timeout=timeout_ms)
    return content, time.perf_counter() - start
