"""`gpudiag dashboard [RUN ...] [--port P] [--host H]`: start the Streamlit dashboard.

Runs ``streamlit run dashboards/app.py`` as a child process with telemetry and file
watching off, prints the URL once the server answers, and on Ctrl-C (or SIGTERM)
forwards the signal, waits for Streamlit to stop, and exits 130 (143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpudiag import rundir
from gpudiag.paths import dashboards_dir, sample_runs_dir

APP = dashboards_dir() / "app.py"
SERVE = dashboards_dir() / "serve.py"
DEFAULT_PORT = 8501
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def default_runs() -> list[Path]:
    """The shipped sample runs and ./gpudiag_runs, those that exist."""
    return [p for p in (sample_runs_dir(), Path.cwd() / "gpudiag_runs") if rundir.is_dir(p)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpudiag dashboard",
        description="Open the Streamlit dashboard on gpudiag runs or profiler trace directories.",
    )
    parser.add_argument(
        "runs",
        nargs="*",
        type=Path,
        help="run directories, trace directories, or folders of them "
        "(default: sample_runs/ and ./gpudiag_runs)",
    )
    parser.add_argument(
        "--port", type=int, default=None, help=f"default {DEFAULT_PORT} or next free"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1 only)"
    )
    parser.add_argument("--dev", action="store_true", help="reload the app when its source changes")
    return parser


def _port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR as Streamlit's own
    server sets it, so only a listening socket counts, not one in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError:
            return False
    return True


def _unusable_host(host: str) -> str | None:
    """Why a server cannot listen on ``host`` (a name that does not resolve, an address
    of no interface here), or None; a bad host read as "port in use" (probe 31i N2)."""
    try:
        socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"cannot resolve it ({exc})"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            return f"cannot listen there ({exc.strerror or exc})"
    return None


def _pick_port(host: str) -> int:
    for port in range(DEFAULT_PORT, DEFAULT_PORT + 50):
        if _port_is_free(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def streamlit_command(runs: list[Path], host: str, port: int, dev: bool = False) -> list[str]:
    return [
        sys.executable,
        str(SERVE),  # `streamlit` itself, plus an analysis prewarm at start-up
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "auto" if dev else "none",
        "--client.toolbarMode",
        "minimal",
        # an unexpected exception shows a generic message, never server paths
        "--client.showErrorDetails",
        "full" if dev else "none",
        "--server.runOnSave",
        "true" if dev else "false",
        "--",
        *[str(r.resolve()) for r in runs],
    ]


def _wait_healthy(proc: subprocess.Popen, url: str) -> bool:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as resp:
                if resp.read().strip() == b"ok":
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen, signum: int) -> None:
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not APP.is_file():
        print(
            f"gpudiag dashboard: {APP} not found (a gpudiag install without its dashboard)",
            file=sys.stderr,
        )
        return 2
    for run in args.runs:
        if not rundir.is_dir(run):
            print(f"gpudiag dashboard: {run}: not a directory", file=sys.stderr)
            return 2
    runs = args.runs or default_runs()
    if args.port is not None and not 0 < args.port < 65536:
        print(f"gpudiag dashboard: --port {args.port}: not a TCP port (1-65535)", file=sys.stderr)
        return 2
    bad_host = _unusable_host(args.host)
    if bad_host:
        print(f"gpudiag dashboard: --host {args.host}: {bad_host}", file=sys.stderr)
        return 2
    if args.port is not None and not _port_is_free(args.host, args.port):
        print(
            f"gpudiag dashboard: port {args.port} on {args.host} is already in use; "
            "pick another with --port, or leave --port out to use a free one",
            file=sys.stderr,
        )
        return 2
    port = args.port if args.port is not None else _pick_port(args.host)
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    url = f"http://{shown_host}:{port}"

    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    proc = subprocess.Popen(streamlit_command(runs, args.host, port, args.dev), env=env)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        # Only signal here: waiting inside a handler would deadlock on Popen's wait lock.
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        if _wait_healthy(proc, url):
            listening = " (listening on all interfaces)" if args.host == "0.0.0.0" else ""
            print(f"gpudiag dashboard: {url}{listening}  (Ctrl-C to stop)", flush=True)
        code = _wait_child(proc, received)
    except KeyboardInterrupt:
        _stop(proc, signal.SIGINT)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 + received[0] if received else code


def _wait_child(proc: subprocess.Popen, received: list[int]) -> int:
    """The child's exit code; killed when it outlives a forwarded signal by STOP_TIMEOUT_S."""
    signalled_at: float | None = None
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if received and signalled_at is None:
                signalled_at = time.monotonic()
            if signalled_at is not None and time.monotonic() - signalled_at > STOP_TIMEOUT_S:
                proc.kill()
