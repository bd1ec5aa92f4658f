"""`gpudiag watch RUN`: a running job, live (rich), or one snapshot (`--once --json`).
RUN is what `gpudiag analyze` takes: one run directory, or the per-node directories of a
multi-node job (``watch node0_dir node1_dir`` or ``watch PARENT``), watched as one job.

Reads only the run directory's append-only tables, incrementally
(:class:`gpudiag.rundir.LiveReader`); the live state is :mod:`gpudiag.analysis.live_snapshot`.
The live view refreshes about once a second and ends when the run ends or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

ENDED = ("ok", "failed", "interrupted", "hang", "launcher_lost", "gone", "unreadable")
# The run directory vanished (deleted, moved, replaced) or cannot be read any more while
# watched: said in one line, and the command ends with 2, as for a path that is no run.
LOST = ("gone", "unreadable")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpudiag watch",
        description="Watch a running gpudiag run: per-rank progress, lagging ranks, "
        "stuck collectives (docs/live.md).",
    )
    p.add_argument(
        "run",
        nargs="+",
        help="run directory written by `gpudiag trace`; or the per-node directories of "
        "one multi-node job (several, or their parent), watched as one job",
    )
    p.add_argument("--once", action="store_true", help="one snapshot, then exit")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default 1)"
    )
    p.add_argument(
        "--window",
        type=int,
        default=50,
        help="steps the rates, medians and lagging ranks cover (default 50)",
    )
    p.add_argument(
        "--stuck-after",
        type=float,
        default=10.0,
        help="seconds in a collective before it shows as stuck (default 10)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    for name, value, low in (
        ("--interval", ns.interval, 0.05),
        ("--stuck-after", ns.stuck_after, 0),
    ):
        if not value >= low:
            print(f"gpudiag watch: {name} {value:g}: expected a number >= {low:g}", file=sys.stderr)
            return 2
    if ns.window < 2:
        print(f"gpudiag watch: --window {ns.window}: expected 2 or more", file=sys.stderr)
        return 2
    from gpudiag import rundir

    paths: list[str] = ns.run
    if len(paths) == 1 and not (rundir.is_run_dir(paths[0]) or rundir.node_parts(paths[0])):
        problems: list[str] = []
        if rundir.is_dir(paths[0]) and rundir.list_dir(paths[0], problems) is None:
            print(f"gpudiag watch: {problems[0]}", file=sys.stderr)  # cannot read (...)
        else:
            print(f"gpudiag watch: {paths[0]}: not a gpudiag run directory", file=sys.stderr)
        return 2
    from gpudiag.analysis import live_snapshot as live

    try:
        monitor = _open_monitor(paths, ns)
    except (rundir.RunFormatError, OSError) as exc:
        print(f"gpudiag watch: {exc}", file=sys.stderr)
        return 2
    parts = getattr(monitor.reader, "parts", None)
    title = " + ".join(map(str, parts)) if parts else paths[0]
    if parts and not (ns.once and ns.json):
        print(f"gpudiag watch: one job from {len(parts)} node directories", file=sys.stderr)

    told: set[str] = set()

    def refresh() -> live.LiveSnapshot:
        snap = monitor.refresh().snapshot
        for line in snap.warnings:  # each unreadable file once, on stderr, naming it
            if line not in told:
                told.add(line)
                print(f"gpudiag: warning: {line}", file=sys.stderr, flush=True)
        return snap

    if ns.once:
        snap = refresh()
        if ns.json:
            print(json.dumps(rundir.fs_safe(snap.to_json()), indent=2))
        else:
            from rich.console import Console

            from gpudiag.report.watch_text import render_live

            Console().print(render_live(snap, title))
        return 2 if snap.state in LOST else 0
    if ns.json:  # a JSON line per refresh, for scripts that follow the run
        return _follow_json(refresh, ns.interval)
    return _follow_rich(refresh, ns.interval, title)


# Per-node directories of a job that is starting may not name one job yet (a node learns
# node 0's job id in its clock exchange): how long `watch` waits for them to.
NODES_AGREE_WAIT_S = 60.0


def _open_monitor(paths: list[str], ns: argparse.Namespace) -> Any:
    """The live monitor of ``paths``; per-node directories of running launchers that do
    not name one job yet are waited for (a loaded host took seconds), said once."""
    from gpudiag import rundir
    from gpudiag.analysis import live_snapshot as live

    deadline = time.monotonic() + NODES_AGREE_WAIT_S
    said = False
    while True:
        try:
            return live.LiveMonitor(paths, ns.window, ns.stuck_after)
        except rundir.RunFormatError:
            if time.monotonic() > deadline or not _nodes_starting(paths):
                raise
            if not said:
                print(
                    "gpudiag watch: the node directories do not name one job yet "
                    "(the job is starting); waiting",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(0.5)


def _nodes_starting(paths: list[str]) -> bool:
    """Several run directories, each of a launcher still running."""
    from gpudiag import rundir

    return len(paths) >= 2 and rundir.launchers_running(paths)


def _follow_json(refresh: Any, interval: float) -> int:
    from gpudiag import rundir  # warnings name files: a byte that is not UTF-8 as \xNN

    try:
        while True:
            snap = refresh()
            print(json.dumps(rundir.fs_safe(snap.to_json())), flush=True)
            if snap.state in ENDED:
                return 2 if snap.state in LOST else 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 130


def _follow_rich(refresh: Any, interval: float, run: str) -> int:
    from rich.console import Console
    from rich.live import Live

    from gpudiag.report.watch_text import render_live

    console = Console()
    try:
        snap = refresh()
        with Live(render_live(snap, run), console=console, auto_refresh=False) as view:
            while snap.state not in ENDED:
                time.sleep(interval)
                snap = refresh()
                view.update(render_live(snap, run), refresh=True)
    except KeyboardInterrupt:
        return 130
    return 2 if snap.state in LOST else 0
