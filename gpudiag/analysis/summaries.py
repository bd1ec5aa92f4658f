"""A run analysed from its per-rank summary.json files only (the 1000-rank path).

A summary (gpudiag/capture/summary.py) holds per rank: status, step statistics
(count, mean/median/p90 ms, data_ms_mean) and collective totals per (op, pg) with the
time the rank spent inside them (``known_time_ns``). No trace or table is opened.

Straggler without traces: in synchronous training every rank has the same step time,
but the rank that arrives last at each collective waits the least inside it. A rank
whose collective time per step is far below the median is named, and the difference
is what the others wait for it per step. Where completion times were not recorded
(gloo without `--time-buckets`), the recorder's ``arrival_ms_mean`` (how far into its
step a rank issues its collectives; steps end together) is used instead: the rank that
issues them last is the one the others wait for.

A rank that left no readable summary.json (SIGKILLed, OOM-killed, or still running) but
a steps table is read from that table instead (:func:`summaries_from_steps`): its step
statistics and data-loading time, with its status.json when there is one. Its collective
totals are unknown, so it is left out of the straggler comparison (one warning names
those ranks). Only a run with neither is refused.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag import rundir
from gpudiag.analysis.dataloader import DataLoaderResult, RunDataWait, dataloader_findings
from gpudiag.analysis.failures import rank_failed_findings
from gpudiag.analysis.findings import hedge_few_steps, sort_findings
from gpudiag.analysis.gpu import GpuResult
from gpudiag.analysis.result import (
    BREAKDOWN_COLUMNS,
    BREAKDOWN_KEYS,
    RANK_COLUMNS,
    AnalysisInputError,
    AnalysisResult,
    RunInfo,
)
from gpudiag.analysis.spill import SpilledTable
from gpudiag.analysis.straggler_findings import straggler_findings


def summary_frame(summaries: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """One row per rank: step stats and time inside collectives per step."""
    rows = []
    for rank, s in summaries.items():
        steps = _dict(s.get("steps"))
        colls = _dict(s.get("collectives"))
        per = colls.get("collectives")
        per = per if isinstance(per, list) else []
        count = int(steps.get("count") or 0)
        coll_ns = sum(float(c.get("known_time_ns") or 0) for c in per if isinstance(c, dict))
        rows.append(
            {
                "rank": int(rank),
                "status": str(s.get("status", "")),
                "steps": count,
                "step_ms_mean": _f(steps.get("mean_ms")),
                "step_ms_median": _f(steps.get("median_ms")),
                "step_ms_p90": _f(steps.get("p90_ms")),
                "data_loading": _f(steps.get("data_ms_mean"), 0.0),
                "coll_ms_per_step": coll_ns / 1e6 / count if count and coll_ns else np.nan,
                "arrival_ms": _f(colls.get("arrival_ms_mean")),
            }
        )
    cols = [
        "rank",
        "status",
        "steps",
        "step_ms_mean",
        "step_ms_median",
        "step_ms_p90",
        "data_loading",
        "coll_ms_per_step",
        "arrival_ms",
    ]
    return pd.DataFrame(rows, columns=cols).sort_values("rank").reset_index(drop=True)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _f(value: Any, default: float = np.nan) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def collective_totals(summaries: dict[int, dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for s in summaries.values():
        colls = _dict(s.get("collectives"))
        for c in colls.get("collectives") or []:
            if isinstance(c, dict):
                rows.append(
                    {
                        "op": str(c.get("op")),
                        "pg_name": str(c.get("pg_name")),
                        "count": _f(c.get("count"), 0.0),
                        "bytes": _f(c.get("bytes"), 0.0),
                        "total_ms": _f(c.get("known_time_ns"), 0.0) / 1e6,
                    }
                )
    if not rows:
        return pd.DataFrame(columns=["op", "pg_name", "count", "bytes", "total_ms"])
    frame = pd.DataFrame(rows)
    return frame.groupby(["op", "pg_name"], as_index=False)[["count", "bytes", "total_ms"]].sum()


def summary_stragglers(frame: pd.DataFrame) -> pd.DataFrame:
    """rank, mean_skew_ms (how much less it waits than the median rank), cost, flag."""
    f = frame.dropna(subset=["coll_ms_per_step"])
    late_sign = -1.0  # less time waiting inside collectives = later arrival
    column = "coll_ms_per_step"
    if len(f) < 2 and "arrival_ms" in frame:
        f, late_sign, column = frame.dropna(subset=["arrival_ms"]), 1.0, "arrival_ms"
    if len(f) < 2:
        return pd.DataFrame(columns=["rank", "mean_skew_ms", "cost_ms_per_step", "is_straggler"])
    value = f[column].to_numpy(float)
    median = float(np.median(value))
    mad = float(np.median(np.abs(value - median)))
    step = float(np.nanmedian(f["step_ms_mean"].to_numpy(float)))
    skew = late_sign * (value - median)
    threshold = max(5 * 1.4826 * mad, 0.02 * step if np.isfinite(step) else 0.0, 1e-3)
    return pd.DataFrame(
        {
            "rank": f["rank"].to_numpy(int),
            "mean_skew_ms": skew,
            "cost_ms_per_step": np.clip(skew, 0, None),
            "is_straggler": skew > threshold,
        }
    )


def step_stats_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary.json's ``steps`` from a rank's steps table rows: what the rank's step
    tracker would have written at its end (capture/steps.py ``step_stats``)."""
    ms = sorted((row["end_ns"] - row["start_ns"]) / 1e6 for row in rows)
    count = len(ms)
    data_ns = sum(row.get("data_ns") or 0 for row in rows)
    optimizer_ns = sum(row.get("optimizer_ns") or 0 for row in rows)
    if not count:
        return {"count": 0, "data_ns_total": 0, "optimizer_ns_total": 0}
    return {
        "count": count,
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": ms[min(count - 1, int(round(0.9 * (count - 1))))],
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "total_ms": sum(ms),
        "data_ns_total": data_ns,
        "optimizer_ns_total": optimizer_ns,
        "data_ms_mean": data_ns / count / 1e6,
        "optimizer_ms_mean": optimizer_ns / count / 1e6,
    }


def _rank_dirs(path: Path) -> dict[int, Path]:
    """Each rank's directory: in the run, or in the node directories of a multi-node
    job (rundir.node_parts), as rundir.load_summaries reads them."""
    parts = rundir.node_parts(path) or [path]
    return {r: rundir.rank_dir(part, r) for part in parts for r in rundir.list_ranks(part)}


def _timed_steps(rank_dir: Path, warnings: list[str]) -> list[dict[str, Any]]:
    table = rundir.table_path(rank_dir, rundir.STEPS)
    if not rundir.is_regular_file(table):
        return []
    rows = rundir.iter_jsonl(table, warnings, schema=rundir.STEPS)
    return [
        r for r in rows if isinstance(r.get("start_ns"), int) and isinstance(r.get("end_ns"), int)
    ]


def _status_of(rank_dir: Path, warnings: list[str]) -> dict[str, Any]:
    status = rank_dir / rundir.STATUS
    if not rundir.is_regular_file(status):
        return {}
    return rundir.read_object(status, rundir.STATUS, warnings) or {}


def summaries_from_steps(
    path: Path, have: Collection[int], warnings: list[str]
) -> dict[int, dict[str, Any]]:
    """A stand-in summary for each rank not in ``have`` whose steps table has timed
    steps: its status.json's fields (``status`` "unknown" without one), the step
    statistics from the table, no collectives."""
    found: dict[int, dict[str, Any]] = {}
    for rank, rank_dir in _rank_dirs(path).items():
        if rank in have:
            continue
        rows = _timed_steps(rank_dir, warnings)
        if not rows:
            continue
        status = _status_of(rank_dir, warnings)
        found[rank] = {
            **status,
            "rank": rank,
            "status": status.get("status") or "unknown",
            "steps": step_stats_from_rows(rows),
            "collectives": {},
        }
    if found:
        warnings.append(
            f"{path}: {len(found)} rank(s) without a readable summary.json "
            f"({_rank_list(sorted(found))}): read from their steps tables; their "
            "collectives are unknown, so they are left out of the straggler comparison"
        )
    return found


def _rank_list(ranks: list[int], shown: int = 10) -> str:
    text = ", ".join(str(r) for r in ranks[:shown])
    return f"ranks {text}" + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")


def analyze_summaries(path: str | Path) -> AnalysisResult:
    path = Path(path)
    warnings: list[str] = []
    manifest, summaries = rundir.load_summaries(path, warnings)
    summaries.update(summaries_from_steps(path, set(summaries), warnings))
    if not summaries:
        raise AnalysisInputError(
            f"{path}: no rank*/summary.json or rank*/steps table to analyse", warnings
        )
    frame = summary_frame(summaries)
    ranks = frame[["rank", "steps", "step_ms_mean", "step_ms_median", "step_ms_p90"]].copy()
    for key in BREAKDOWN_KEYS:
        ranks[key] = 0.0
    ranks["data_loading"] = frame["data_loading"]
    ranks["other"] = (frame["step_ms_mean"] - frame["data_loading"]).clip(lower=0)
    ranks = ranks[list(RANK_COLUMNS)]
    step_ms = float(np.nanmean(ranks["step_ms_mean"])) if len(ranks) else float("nan")
    slow = summary_stragglers(frame)
    step_by_rank = dict(
        zip(ranks["rank"].astype(int), ranks["step_ms_mean"].astype(float), strict=False)
    )
    dl = DataLoaderResult(
        run={
            int(row.rank): RunDataWait(
                steps=int(row.steps),
                data_ms_per_step=float(row.data_loading),
                data_ms_max_step=None,  # a summary holds the mean only
                step_ms_mean=float(row.step_ms_mean),
            )
            for row in frame.itertuples(index=False)
        }
    )
    found = rank_failed_findings(manifest, summaries) + straggler_findings(slow, step_ms)
    found += dataloader_findings(dl, step_by_rank)
    for f in found:
        if f.kind == "straggler":
            f.evidence["method"] = "least time inside collectives per step (summaries only)"
            f.evidence = {k: v for k, v in f.evidence.items() if k != "all_ranks_mean_skew_ms"}
    hedge_few_steps(found, int(frame["steps"].max()) if len(frame) else 0)
    statuses = frame["status"].value_counts().to_dict()
    run = RunInfo(
        kind="summaries",
        path=str(path),
        world_size=manifest.get("world_size") or len(summaries),
        backend=manifest.get("backend"),
        devices=[],
        ranks_present=[int(r) for r in frame["rank"]],
        traced_ranks=[],
        steps_analysed=int(frame["steps"].max()) if len(frame) else 0,
        status=manifest.get("status"),
        exit_code=manifest.get("exit_code"),
        rank_statuses={str(k): int(v) for k, v in statuses.items()},
        synthetic=bool(manifest.get("synthetic", False)),
    )
    empty = pd.DataFrame()
    return AnalysisResult(
        source=path,
        run=run,
        ranks=ranks,
        breakdown=pd.DataFrame(columns=list(BREAKDOWN_COLUMNS)),
        collectives=SpilledTable.of(),
        collective_summary=collective_totals(summaries),
        buckets=SpilledTable.of(),
        skew=SpilledTable.of(),
        stragglers=slow,
        dataparallel=None,
        dataloader=dl,
        gpu=GpuResult(),
        gpu_samples=empty,
        host_samples=empty,
        findings=sort_findings(found),
        lint=None,
        warnings=warnings,
        step_ms=step_ms,
    )
