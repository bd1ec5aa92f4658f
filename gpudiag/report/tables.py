"""Tables shared by the HTML report and the dashboard (presentation only)."""

from __future__ import annotations

import pandas as pd

from gpudiag.analysis.live_snapshot import LiveSnapshot
from gpudiag.analysis.whatif import Projection
from gpudiag.report import numbers

# Columns of :func:`whatif_frame` that are not milliseconds, and their decimals (the
# terminal's `gpudiag whatif` prints the same one decimal).
WHATIF_DIGITS = {"saving %": 1}


def whatif_frame(projections: list[Projection]) -> pd.DataFrame:
    """One row per projected fix: the same numbers as `gpudiag whatif` and the JSON."""
    return pd.DataFrame(
        {
            "fix": [p.scenario for p in projections],
            "finding": [p.finding_kind for p in projections],
            "ranks": [", ".join(map(str, p.ranks)) or "all" for p in projections],
            "step ms": [round(p.step_ms, 2) for p in projections],
            "projected ms": [round(p.projected_step_ms, 2) for p in projections],
            "range ms": [
                f"{numbers.num(p.projected_low_ms)} to {numbers.num(p.projected_high_ms)}"
                for p in projections
            ],
            "saving ms": [round(p.saving_ms, 2) for p in projections],
            "saving %": [round(p.saving_pct, 1) for p in projections],
            "assumptions": ["; ".join(p.assumptions) for p in projections],
        }
    )


# --------------------------------------------------------------------------- live

# rundir's run statuses in the words of the live views (docs/live.md)
LIVE_STATE_WORDS = {
    "running": "running",
    "ok": "finished",
    "failed": "failed",
    "hang": "hung",
    "interrupted": "interrupted",
    "launcher_lost": "launcher lost",
}


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def live_rank_names(snap: LiveSnapshot, ranks: list[int]) -> str:
    """``3, 5`` -- or, when the job's ranks are on several nodes, ``3 (node 1), 5 (node
    1)``, as the straggler finding names them."""
    nodes = {r.rank: r.node for r in snap.ranks}
    if len({n for n in nodes.values() if n is not None}) < 2:
        return _ranks(ranks)
    return ", ".join(
        f"{r} (node {nodes[r]})" if nodes.get(r) is not None else str(r) for r in ranks
    )


def live_state_text(snap: LiveSnapshot) -> str:
    """The run's state as a reader says it: ``failed (rank 1)``, ``hung``, ``running``."""
    word = LIVE_STATE_WORDS.get(snap.state, snap.state)
    if snap.state == "failed" and snap.failed_ranks:
        plural = "s" if len(snap.failed_ranks) > 1 else ""
        word += f" (rank{plural} {_ranks(snap.failed_ranks)})"
    return word


def live_newest_step(snap: LiveSnapshot) -> int | None:
    steps = [r.step for r in snap.ranks if isinstance(r.step, int)]
    return max(steps) if steps else None


def _gib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**30, 2)


def live_rank_frame(snap: LiveSnapshot) -> pd.DataFrame:
    """One row per rank: the same numbers as `gpudiag watch` and its JSON."""
    lagging = set(snap.lagging)
    return pd.DataFrame(
        {
            "rank": [r.rank for r in snap.ranks],
            "node": [r.node for r in snap.ranks],
            "step": [r.step for r in snap.ranks],
            "steps/s": [r.steps_per_s for r in snap.ranks],
            "last step ms": [r.last_step_ms for r in snap.ranks],
            "median step ms": [r.median_step_ms for r in snap.ranks],
            "since last step s": [r.since_last_step_s for r in snap.ranks],
            "data wait ms": [r.data_wait_ms for r in snap.ranks],
            "GPU memory GiB": [_gib(r.memory_bytes) for r in snap.ranks],
            "status": [r.status for r in snap.ranks],
            "lagging": ["lagging" if r.rank in lagging else "" for r in snap.ranks],
        },
        dtype=object,
    )


def live_stuck_frame(snap: LiveSnapshot) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "op": [s.op for s in snap.stuck],
            "process group": [s.pg for s in snap.stuck],
            "seq": [s.seq for s in snap.stuck],
            "waiting s": [s.waiting_s for s in snap.stuck],
            "arrived": [_ranks(s.arrived) for s in snap.stuck],
            "never arrived": [_ranks(s.missing) for s in snap.stuck],
        },
        dtype=object,
    )


def live_node_frame(snap: LiveSnapshot) -> pd.DataFrame:
    """One row per node (host CPU and memory) and one per GPU sampled on it."""
    rows: list[dict[str, object]] = []
    for n in snap.nodes:
        rows.append(
            {
                "node": n.node,
                "device": "host",
                "util %": n.cpu_percent,
                "memory GiB": _gib(n.mem_used),
                "of GiB": _gib(n.mem_total),
                "power W": None,
                "temp °C": None,
                "throttled": "",
            }
        )
        for g in n.gpus:
            rows.append(
                {
                    "node": n.node,
                    "device": f"GPU {g.gpu}",
                    "util %": g.util_gpu,
                    "memory GiB": _gib(g.mem_used),
                    "of GiB": _gib(g.mem_total),
                    "power W": g.power_w,
                    "temp °C": g.temp_c,
                    "throttled": ", ".join(g.throttled),
                }
            )
    return pd.DataFrame(rows, dtype=object)


__all__ = [
    "LIVE_STATE_WORDS",
    "live_newest_step",
    "live_node_frame",
    "live_rank_frame",
    "live_state_text",
    "live_stuck_frame",
    "whatif_frame",
]
