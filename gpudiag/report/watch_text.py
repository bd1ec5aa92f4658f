"""Rich rendering of a live snapshot (`gpudiag watch`): the state line, stuck
collectives, the per-rank table (lagging ranks marked) and the per-node samples.
Everything from the run directory is shown as plain Text, never parsed as markup."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpudiag.analysis.live_snapshot import (
    COLLECTIVES_DELAY_S,
    COLLECTIVES_MIN_DELAY_S,
    LiveSnapshot,
)
from gpudiag.report import numbers
from gpudiag.report.tables import live_newest_step, live_rank_names, rank_list

STATE_STYLE = {
    "running": "bold green",
    "ok": "bold cyan",
    "failed": "bold red",
    "hang": "bold red",
    "hang_suspected": "bold yellow",
    "interrupted": "yellow",
    "launcher_lost": "bold yellow",
}


def _fmt(value: float | int | None, digits: int = numbers.MS_DIGITS) -> str:
    """The one formatter's text (two decimals, integers without, the dash for none), as
    the dashboard's live table shows the same snapshot."""
    return numbers.num(value, digits)


def _gib(value: int | None) -> str:
    return numbers.NA if value is None else f"{numbers.num(value / 2**30)} GiB"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks) or numbers.NA


def render_live(snap: LiveSnapshot, run: str) -> RenderableType:
    parts: list[RenderableType] = []
    head = Text()
    head.append("gpudiag watch ", style="bold")
    head.append(numbers.terminal_text(run))
    head.append("   state: ")
    head.append(snap.state, style=STATE_STYLE.get(snap.state, "bold"))
    if snap.failed_ranks:
        head.append(f" (rank {_ranks(snap.failed_ranks)})", style="red")
    parts.append(head)
    lag = Text("lagging: ")
    if snap.lagging:
        lag.append(f"rank {live_rank_names(snap, snap.lagging)}", style="bold yellow")
    else:
        lag.append("none")
    if snap.lagging_window:
        first, last = snap.lagging_window
        newest = live_newest_step(snap)
        behind = (
            f"; collectives written every {COLLECTIVES_MIN_DELAY_S}-{COLLECTIVES_DELAY_S} s, "
            f"{newest - last} steps behind step {newest}"
            if newest is not None and newest > last + 1
            else ""
        )
        lag.append(f"  (steps {first}-{last}{behind})", style="dim")
    parts.append(lag)
    for s in snap.stuck:
        line = Text("STUCK ", style="bold red")
        line.append(
            numbers.terminal_text(
                f"{s.op} pg {s.pg} seq {s.seq}: waiting {s.waiting_s:.1f} s; "
                f"arrived (waiting in it): {rank_list(s.arrived)} "
                f"({len(s.arrived)} of {len(s.arrived) + len(s.missing)} ranks); never arrived: "
            )
        )
        line.append(live_rank_names(snap, s.missing) or numbers.NA, style="bold red")
        parts.append(line)
    table = Table(box=None, pad_edge=False)
    for name in ("rank", "node", "step", "steps/s", "last ms", "median ms", "since last s",
                 "data ms", "memory", "status"):  # fmt: skip
        table.add_column(name, justify="left" if name == "status" else "right")
    lagging = set(snap.lagging)
    for r in snap.ranks:
        table.add_row(
            Text(str(r.rank), style="bold yellow" if r.rank in lagging else ""),
            _fmt(r.node),
            _fmt(r.step),
            _fmt(r.steps_per_s),
            _fmt(r.last_step_ms),
            _fmt(r.median_step_ms),
            _fmt(r.since_last_step_s, numbers.S_DIGITS),
            _fmt(r.data_wait_ms),
            _gib(r.memory_bytes),
            Text(numbers.terminal_text(r.status or "")),
        )
    parts.append(table)
    for n in snap.nodes:
        line = Text(f"node {n.node}: host CPU {numbers.pct(n.cpu_percent)}, memory ")
        line.append(f"{_gib(n.mem_used)} / {_gib(n.mem_total)}")
        for g in n.gpus:
            line.append(
                f"; GPU {g.gpu} {numbers.pct(g.util_gpu)} {_gib(g.mem_used)}"
                + (f" throttled ({', '.join(g.throttled)})" if g.throttled else "")
            )
        parts.append(line)
    return Group(*parts)
