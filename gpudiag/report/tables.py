"""Tables shared by the HTML report and the dashboard (presentation only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import pandas as pd

from gpudiag.analysis.dataloader import DataLoaderResult
from gpudiag.analysis.gpu import NvmlGpu
from gpudiag.analysis.live_snapshot import LiveSnapshot, StuckCollective
from gpudiag.analysis.whatif import Projection
from gpudiag.report import numbers, overview
from gpudiag.report.overview import readable_header

# Columns of :func:`whatif_frame` that are not milliseconds, and their decimals (the
# terminal's `gpudiag whatif` prints the same one decimal).
WHATIF_DIGITS = {"saving %": 1}


def whatif_frame(projections: list[Projection]) -> pd.DataFrame:
    """One row per projected fix: the same numbers as `gpudiag whatif` and the JSON."""
    return pd.DataFrame(
        {
            "fix": [p.scenario for p in projections],
            "finding": [p.finding_kind for p in projections],
            "ranks": [numbers.rank_cell(p.ranks) for p in projections],
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


# --------------------------------------------------------------------------- detail tables
#
# The tables below the first screen (data loading, DDP buckets, every collective call,
# NVML, DataParallel stages): each column under a header a person reads, with its unit,
# never the analysis's key; the numbers go through numbers.styled / frame_text like every
# other table.

MIB = 2**20


def with_headers(frame: pd.DataFrame, headers: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` with each column named by ``headers``, any other key in words with its
    unit (:func:`gpudiag.report.overview.readable_header`)."""
    return frame.rename(columns=lambda c: headers.get(str(c), readable_header(str(c))))


def _step_header(window: str) -> str:
    return f"step ms (mean over {window})"


DATA_WAIT_HEADERS = {
    "rank": "rank",
    "steps": "steps",
    "events": "DataLoader waits recorded",
    "data_ms_per_step": "data wait ms/step",
    "data_ms_max_step": "data wait, longest step ms",
    "gpu_idle_waiting_ms_per_step": "GPU idle while waiting ms/step",
    "startup_ms": "first-step start-up wait ms (set apart)",
    "whole_trace": "whole trace as one step",
}
HOST_SYNC_HEADERS = {
    "rank": "rank",
    "count_per_step": "syncs per step",
    "ms_per_step": "GPU idle they cause ms/step",
    "host_blocking_ms_per_step": "host blocked in them ms/step",
    "calls": "calls (count in the profiled steps)",
}
DATA_WAIT_EVERY = "Data wait over every recorded step (steps table)"
DATA_WAIT_PROFILED = "Data wait in the profiled steps (DataLoader events)"
# What the profiled table's data wait measures beside the charts' "data loading" of the
# same steps (analysis/dataloader.py against analysis/breakdown.py): two numbers for one
# window read as a contradiction (0.32 against 0.23 ms/step: probe 31f, D13).
DATA_WAIT_PROFILED_NOTE = (
    "Data wait: all the time the training thread spends in DataLoader `__next__` in the "
    "profiled steps, whatever runs meanwhile (a first-step start-up wait, if any, set "
    "apart). The Overview and Step breakdown charts count each instant once, by priority: "
    "their data loading is only the part of that wait when no compute and no communication "
    "run (a collective still transferring counts as communication), so it can be lower; a "
    "start-up wait stays in its step there."
)
HOST_SYNC = "Host synchronisation in the profiled steps"


def data_wait_frames(dl: DataLoaderResult) -> dict[str, pd.DataFrame]:
    """The data-loading result as tables, titled: every step (steps table), the profiled
    window (trace DataLoader events), and host synchronisation points. The step-time
    column names its window: the two means of one rank's step appear on one page."""
    tables: dict[str, pd.DataFrame] = {}
    if dl.run:
        every = pd.DataFrame(
            [{"rank": rank, **asdict(row)} for rank, row in sorted(dl.run.items())]
        )
        headers = {**DATA_WAIT_HEADERS, "step_ms_mean": _step_header("every recorded step")}
        tables[DATA_WAIT_EVERY] = with_headers(every, headers)
    if dl.trace:
        profiled = pd.DataFrame([asdict(t) for t in dl.trace])
        headers = {**DATA_WAIT_HEADERS, "step_ms_mean": _step_header("profiled steps")}
        tables[DATA_WAIT_PROFILED] = with_headers(profiled, headers)
    if dl.host_sync:
        rows = [
            {
                "rank": h.rank,
                "count_per_step": h.count_per_step,
                "ms_per_step": h.ms_per_step,
                "host_blocking_ms_per_step": h.host_blocking_ms_per_step,
                "calls": ", ".join(
                    f"{name} ×{calls.count}"
                    for name, calls in sorted(h.by_name.items(), key=lambda kv: -kv[1].total_ms)
                ),
            }
            for h in dl.host_sync
        ]
        tables[HOST_SYNC] = with_headers(pd.DataFrame(rows), HOST_SYNC_HEADERS)
    return tables


_TIMESTAMP_COLUMNS = ("start_ns", "end_ns", "enqueue_ns", "t_ns")


def readable_times(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw nanosecond columns as milliseconds: timestamps from the frame's first one
    (dropped where the analysis already gives a ``start_ms`` offset), durations scaled."""
    out = frame.copy()
    stamps = [c for c in _TIMESTAMP_COLUMNS if c in out]
    if stamps and "start_ms" in out:
        out = out.drop(columns=stamps)
    elif stamps:
        values = out[stamps].apply(pd.to_numeric, errors="coerce")
        origin = values.min().min()
        for col in stamps:
            out[col] = (values[col] - origin) / 1e6
        out = out.rename(columns={c: c.removesuffix("_ns") + "_from_first_ms" for c in stamps})
    ns = [c for c in out.columns if str(c).endswith("_ns")]
    for col in ns:
        out[col] = pd.to_numeric(out[col], errors="coerce") / 1e6
    return out.rename(columns={c: str(c).removesuffix("_ns") + "_ms" for c in ns})


def _mib(frame: pd.DataFrame, column: str = "bytes") -> pd.DataFrame:
    if column in frame:
        frame = frame.assign(**{column: pd.to_numeric(frame[column], errors="coerce") / MIB})
    return frame


BUCKET_HEADERS = {
    "rank": "rank",
    "step": "step",
    "bucket": "bucket (issue order)",
    "bytes": "size MiB",
    "start_ms": "start ms (in step)",
    "dur_ms": "duration ms",
}


def bucket_frame(buckets: pd.DataFrame, ddp: bool = True) -> pd.DataFrame:
    """The all-reduces of each step, in issue order, for reading: sizes in MiB, times in
    ms, no raw nanosecond stamps. Each is a "bucket" only where the run shows DDP
    (``ddp``: RunInfo.ddp_evidence), else a "call" (a Megatron TP run's, issue 31, D)."""
    headers = BUCKET_HEADERS if ddp else {**BUCKET_HEADERS, "bucket": "call (issue order)"}
    return with_headers(_mib(readable_times(buckets)), headers)


COLLECTIVE_CALL_HEADERS = {
    "rank": "rank",
    "pg_name": "group",
    "pg_size": "group size",
    "seq": "sequence number",
    "index": "call on this rank",
    "op": "op",
    "bytes": "size MiB",
    "dtype": "dtype",
    "start_from_first_ms": "start ms (from the first call)",
    "end_from_first_ms": "end ms (from the first call)",
    "enqueue_from_first_ms": "enqueued ms (from the first call)",
    "start_ms": "start ms (in step)",
    "dur_ms": "duration ms",
    "algbw_gbs": "algbw GB/s",
    "busbw_gbs": "busbw GB/s",
    "peak_gbs": "link peak GB/s",
    "link": "link",
    "step": "step",
    "source": "recorded by",
}
# counts stored as floats (a column with a missing value): no decimals
COLLECTIVE_CALL_DIGITS = {"group size": 0, "sequence number": 0}


def collective_calls_frame(calls: pd.DataFrame) -> pd.DataFrame:
    """Every collective call (a table of the analysis) for reading: sizes in MiB, times
    in ms from the first call, a unit in every header."""
    return with_headers(_mib(readable_times(calls)), COLLECTIVE_CALL_HEADERS)


NVML_HEADERS = {
    "node": "node",
    "gpu": "GPU",
    "samples": "samples",
    "util_gpu_mean": "GPU utilisation % (mean)",
    "util_mem_mean": "memory utilisation % (mean)",
    "power_w_mean": "power W (mean)",
    "temp_c_mean": "temperature °C (mean)",
    "sm_clock_mhz_mean": "SM clock MHz (mean)",
    "mem_used_max_gb": "memory used GB (max)",
    "mem_total_gb": "memory GB (total)",
    "mem_headroom_fraction": "memory headroom %",
    "throttled_share": "time throttled %",
    "throttle_share_by_reason": "throttled by reason (% of the time)",
    "throttled_clock_ratio": "clock when throttled (share of the usual)",
}
_PERCENT_OF_FRACTION = ("mem_headroom_fraction", "throttled_share")


def _reasons(value: Any) -> str:
    if not isinstance(value, dict) or not value:
        return numbers.NA
    return ", ".join(f"{k} {numbers.pct(100 * v, 0)}" for k, v in value.items())


def nvml_frame(nvml: tuple[NvmlGpu, ...] | list[NvmlGpu]) -> pd.DataFrame:
    """The NVML summary per GPU: fractions as percentages, each header with its unit."""
    frame = pd.DataFrame([n.to_json() for n in nvml])
    for col in _PERCENT_OF_FRACTION:
        if col in frame:
            frame[col] = 100 * pd.to_numeric(frame[col], errors="coerce")
    if "throttle_share_by_reason" in frame:
        frame["throttle_share_by_reason"] = frame["throttle_share_by_reason"].map(_reasons)
    return with_headers(frame, NVML_HEADERS)


def dp_stage_frame(stage_ms: Mapping[str, float], events: Mapping[str, int]) -> pd.DataFrame:
    """DataParallel's stages per step: each stage by the name of the DataParallel method
    it times (``parallel_apply``), its ms per step and the events counted."""
    return pd.DataFrame(
        {
            "stage": [f"{k.replace('_', ' ')} (DataParallel.{k})" for k in stage_ms],
            "ms/step": list(stage_ms.values()),
            "events": [int(events.get(k, 0)) for k in stage_ms],
        }
    )


# --------------------------------------------------------------------------- live

# rundir's run statuses in the words of the live views (docs/live.md)
LIVE_STATE_WORDS = {
    "running": "running",
    "ok": "finished",
    "failed": "failed",
    "hang": "hung",
    "hang_suspected": "hang suspected (still running)",
    "interrupted": "interrupted",
    "launcher_lost": "launcher lost",
}


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def rank_list(ranks: list[int]) -> str:
    """``rank 0`` / ``ranks 0, 1, 2``: rank numbers that cannot be read as a count."""
    if not ranks:
        return "none"
    return f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"


def stuck_arrived_text(snap: LiveSnapshot, stuck: StuckCollective) -> str:
    """Who is in a stuck collective and who never came, as rank numbers with their
    count: "arrived (waiting in it): rank 0 (1 of 2 ranks); never arrived: rank 1".
    A bare "arrived: 0" read as a count of ranks (probe N3)."""
    total = len(stuck.arrived) + len(stuck.missing)
    missing = live_rank_names(snap, stuck.missing)
    return (
        f"arrived (waiting in it): {rank_list(stuck.arrived)} "
        f"({len(stuck.arrived)} of {total} ranks); "
        f"never arrived: {'rank ' + missing if missing else 'none'}"
    )


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
            # the chart's third bar: what tells the lagging rank (probe 31j, D8)
            "late at collectives ms": [r.late_ms for r in snap.ranks],
            "GPU memory GiB": [_gib(r.memory_bytes) for r in snap.ranks],
            "status": [r.status for r in snap.ranks],
            # "no", not a blank: a blank cell is the missing-value mark's (numbers.NA)
            "lagging": ["lagging" if r.rank in lagging else "no" for r in snap.ranks],
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
            # rank numbers, not counts ("arrived: 0" read as "none arrived": probe N3)
            "ranks already in it": [rank_list(s.arrived) for s in snap.stuck],
            "ranks never arrived": [rank_list(s.missing) for s in snap.stuck],
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
                "util % (host: of all cores)": n.cpu_percent,
                "memory GiB": _gib(n.mem_used),
                "of GiB": _gib(n.mem_total),
                "power W": None,
                "temp °C": None,
                "throttled": None,  # not a GPU: not applicable
            }
        )
        for g in n.gpus:
            rows.append(
                {
                    "node": n.node,
                    "device": f"GPU {g.gpu}",
                    "util % (host: of all cores)": g.util_gpu,
                    "memory GiB": _gib(g.mem_used),
                    "of GiB": _gib(g.mem_total),
                    "power W": g.power_w,
                    "temp °C": g.temp_c,
                    "throttled": ", ".join(g.throttled) or "no",
                }
            )
    return pd.DataFrame(rows, dtype=object)


def finding_changes_frame(changes: list[Any]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "finding": [c.kind for c in changes],
            "A": [overview.change_side(c.a, c.ranks_a) for c in changes],
            "B": [overview.change_side(c.b, c.ranks_b) for c in changes],
            "A ms/step": [numbers.num(c.cost_a_ms) for c in changes],
            "B ms/step": [numbers.num(c.cost_b_ms) for c in changes],
            "change": [c.change for c in changes],
        }
    )


def per_rank_pair(a: Any, b: Any) -> pd.DataFrame:
    """Both runs' per-rank step time and its largest parts, side by side (no delta)."""
    cols = ["step_ms_mean", "compute", "comm_exposed", "other"]
    headers = overview.rank_headers(a)  # the Overview's names
    left = a.ranks[["rank", *[c for c in cols if c in a.ranks]]].rename(
        columns={c: f"A {headers[c]}" for c in cols}
    )
    right = b.ranks[["rank", *[c for c in cols if c in b.ranks]]].rename(
        columns={c: f"B {headers[c]}" for c in cols}
    )
    merged = left.merge(right, on="rank", how="outer").sort_values("rank")
    order = ["rank", *[f"{w} {headers[c]}" for c in cols for w in "AB"]]
    return merged[[c for c in order if c in merged]].reset_index(drop=True)


__all__ = [
    "finding_changes_frame",
    "per_rank_pair",
    "BUCKET_HEADERS",
    "COLLECTIVE_CALL_HEADERS",
    "DATA_WAIT_HEADERS",
    "NVML_HEADERS",
    "bucket_frame",
    "compare_view",
    "FINDING_COSTS_TEXT",
    "collective_calls_frame",
    "data_wait_frames",
    "dp_stage_frame",
    "nvml_frame",
    "readable_times",
    "with_headers",
    "LIVE_STATE_WORDS",
    "live_newest_step",
    "live_node_frame",
    "live_rank_frame",
    "live_state_text",
    "live_stuck_frame",
    "rank_list",
    "stuck_arrived_text",
    "whatif_frame",
]


def compare_view(comparison: Any, a: Any, b: Any) -> tuple[pd.DataFrame, dict[str, str]]:
    """Compare's metric table as every view shows it, and its headers: exposed
    communication split into the wait for late peers and the transfer as the Overview
    splits it (:func:`overview.split_compare_table`), each metric under the Overview's
    name. `gpudiag compare` showed exposed communication whole where the dashboard split
    it: two tables for one pair of runs (probe 31m)."""
    headers = overview.metric_headers(comparison.has_gpu_trace)
    named = overview.component_labels(comparison.has_gpu_trace)
    headers.update({k: f"{named[k]} ms/step" for k in ("comm_wait", "comm_transfer")})
    return overview.split_compare_table(comparison.table, a, b), headers


# Under compare's finding changes in every view: a finding's cost is over its own window
# and ranks, not the metric table's (the straggler's "others wait 37.34" beside the
# table's "waiting for late peers 28.84", neither named: probe 31m).
FINDING_COSTS_TEXT = (
    "A finding's ms/step is its own cost, over its own steps and ranks (a straggler's: the "
    "other ranks' wait for it, over every matched step), not the metric table's: its "
    "'waiting for late peers' is every rank's wait for whichever peer came last, the late "
    "rank's own included, the mean over all ranks and the profiled steps."
)


def moved_components_text(
    moved: list[tuple[str, float]], table: pd.DataFrame, headers: dict[str, str]
) -> str:
    """Compare's "components that moved" line over the rows its table shows: exposed
    communication as the table splits it (waiting, transfer: their own deltas), and the
    window said (the table's means over each run's analysed steps, not the steady step).
    It had named "exposed communication +24.69 ms", a row the table did not have, with no
    window beside a steady step that moved far less (probe 31j, D10)."""
    shown = set(table["metric"])
    rows = []
    for name, delta in moved:
        if name == "comm_exposed" and name not in shown:
            for part in ("comm_wait", "comm_transfer"):
                if part in shown:
                    value = float(table.loc[table["metric"] == part, "delta"].iloc[0])
                    rows.append((part, value))
        else:
            rows.append((name, delta))
    if not rows:
        return ""
    # largest change first, as `gpudiag compare` and its JSON list them: the split parts
    # stood where exposed communication was, above larger changes (probe 31k, N4)
    rows.sort(key=lambda row: -abs(row[1]))
    parts = "; ".join(f"{headers.get(n, n).removesuffix(' ms/step')} {d:+.2f} ms" for n, d in rows)
    return (
        f"Components that moved (ms/step, the mean over ranks and each run's analysed steps, as the "
        f"table's '{headers.get('step_ms_mean', 'step ms (mean)')}' row; its "
        f"'{headers.get('steady_step_ms', 'steady step ms')}' row is over every recorded "
        f"step): {parts}"
    )
