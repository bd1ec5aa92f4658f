"""Host CPU contention during the steps, from the launcher's host samples
(``node*/host_samples.jsonl``): how busy the host's CPUs were, and how much of that was
the job's own workers. A rank that arrives late on a host whose CPUs other processes
keep busy may be late because the scheduler gave it less time, not because of anything
the rank does: the straggler finding then says so and stays low (docs/findings.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# Host CPUs at least this busy (percent of all cores) ...
SATURATED_PCT = 90.0
# ... with at least this share of them (percent of all cores) used by other processes.
OTHERS_PCT = 25.0


def _cpu_count(manifest: dict[str, Any], node: int) -> int | None:
    for host in manifest.get("hosts") or []:
        if isinstance(host, dict) and host.get("node_rank", 0) == node:
            count = host.get("cpu_count")
            return int(count) if isinstance(count, (int, float)) and count > 0 else None
    return None


def host_contention(run: Any) -> dict[str, Any] | None:
    """Median over the samples taken during the steps, per node: host CPU busy percent,
    the job's workers' share, the rest (other processes); ``contended`` when a node's CPUs
    were saturated with other processes taking ``OTHERS_PCT`` or more. None without
    samples."""
    samples = getattr(run, "host_samples", None)
    steps = getattr(run, "steps", None)
    manifest = getattr(run, "manifest", None) or {}
    if samples is None or samples.empty or steps is None or steps.empty:
        return None
    need = {"t_ns", "cpu_percent", "proc_cpu_percent"}
    if not need <= set(samples.columns):
        return None
    lo, hi = steps["start_ns"].min(), steps["end_ns"].max()
    window = samples[(samples["t_ns"] >= lo) & (samples["t_ns"] <= hi)]
    nodes: dict[str, dict[str, float]] = {}
    node_col = window["node"] if "node" in window else pd.Series(0, index=window.index)
    for node, part in window.groupby(node_col):
        cpus = _cpu_count(manifest, int(node))
        host = pd.to_numeric(part["cpu_percent"], errors="coerce").dropna()
        job = pd.to_numeric(part["proc_cpu_percent"], errors="coerce").dropna()
        if cpus is None or host.empty or job.empty:
            continue
        host_pct = float(np.median(host))
        job_pct = float(np.median(job)) / cpus
        nodes[str(int(node))] = {
            "host_busy_pct": round(host_pct, 1),
            "job_busy_pct": round(job_pct, 1),
            "others_busy_pct": round(max(host_pct - job_pct, 0.0), 1),
            "cpu_count": cpus,
            "samples": int(len(part)),
        }
    if not nodes:
        return None
    contended = any(
        n["host_busy_pct"] >= SATURATED_PCT and n["others_busy_pct"] >= OTHERS_PCT
        for n in nodes.values()
    )
    return {"contended": contended, "nodes": nodes}
