"""One function per dashboard view. Each renders an AnalysisResult (or says plainly
what is missing); none computes analysis of its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from gpudiag import rundir
from gpudiag.analysis.findings import measured_as
from gpudiag.report import html as html_report

from . import figures, runs

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
GPU_METRICS = (
    ("util_gpu", "%"),
    ("sm_clock_mhz", "MHz"),
    ("power_w", "W"),
    ("mem_used", "bytes"),
    ("temp_c", "°C"),
    ("pcie_tx_kbs", "KB/s"),
    ("nvlink_tx_kbs", "KB/s"),
)
HOST_METRICS = (
    ("cpu_percent", "%"),
    ("proc_cpu_percent", "%"),
    ("mem_used", "bytes"),
    ("proc_rss", "bytes"),
)
DP_PHASES = ("scatter", "replicate", "parallel_apply", "gather")


@dataclass
class ViewContext:
    ref: runs.RunRef
    result: Any  # gpudiag.analysis.AnalysisResult
    roots: list[Path]
    all_runs: list[runs.RunRef]
    result_of: Callable[[runs.RunRef], tuple[Any, str | None]]
    timeline_of: Callable[[Any, runs.RunRef, tuple[int, ...] | None, int], pd.DataFrame]


def _has_rows(frame: Any) -> bool:
    return isinstance(frame, pd.DataFrame) and len(frame) > 0


def _chart(fig: Any) -> None:
    st.plotly_chart(fig, width="stretch", config={"displaylogo": False})


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "–"
    return "–" if value is None or value == "" else str(value)


def _render_mapping(data: dict[str, Any], title_prefix: str = "") -> None:
    """Scalars as metrics, frames as tables, nested mappings as JSON."""
    scalars = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None}
    if scalars:
        cols = st.columns(min(4, len(scalars)))
        for i, (key, value) in enumerate(scalars.items()):
            cols[i % len(cols)].metric(f"{title_prefix}{key}", _scalar(value))
    for key, value in data.items():
        if key in scalars:
            continue
        if isinstance(value, pd.DataFrame):
            st.markdown(f"**{title_prefix}{key}**")
            st.dataframe(value, width="stretch", hide_index=True)
        elif records_frame(value) is not None:
            st.markdown(f"**{title_prefix}{key}**")
            st.dataframe(records_frame(value), width="stretch", hide_index=True)
        elif isinstance(value, (dict, list)):
            st.markdown(f"**{title_prefix}{key}**")
            st.json(_jsonable(value), expanded=False)


def records_frame(value: Any) -> pd.DataFrame | None:
    """A list of flat-ish dicts (per-rank records) as a table; nested values as text."""
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None
    rows = [
        {
            k: (json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)
            for k, v in r.items()
        }
        for r in value
    ]
    return pd.DataFrame(rows)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# --------------------------------------------------------------------------- Overview


def health_verdict(findings: list[Any]) -> tuple[str, str]:
    """(level, sentence) from the findings' severities."""
    severities = {f.severity for f in findings}
    if "high" in severities:
        return "error", "Needs attention: at least one high-severity bottleneck."
    if "medium" in severities:
        return "warning", "Some inefficiency: medium-severity findings below."
    if findings:
        return "info", "Healthy, with minor findings."
    return "success", "Healthy: no bottleneck found."


def overview(ctx: ViewContext) -> None:
    result = ctx.result
    info = result.run or {}
    st.header(f"Overview · {ctx.ref.label}")
    st.caption(str(result.source))
    status = _scalar(info.get("status"))
    if info.get("exit_code") not in (None, 0):
        status += f" (exit {info.get('exit_code')})"
    facts = [
        ("World size", _scalar(info.get("world_size"))),
        ("Backend", _scalar(info.get("backend"))),
        ("Steps analysed", _scalar(info.get("steps_analysed"))),
        ("Status", status),
        ("Source", _scalar(info.get("kind"))),
    ]
    for col, (label, value) in zip(st.columns(len(facts)), facts, strict=True):
        col.metric(label, value)
    devices = [
        str(d.get("name", d)) if isinstance(d, dict) else str(d) for d in info.get("devices") or []
    ]
    st.markdown(f"**Devices:** {', '.join(devices) if devices else 'CPU only (no GPU in the run)'}")

    verdict_and_findings, per_rank = st.container(), st.container()
    # The chart is sent first though laid out below the findings: the browser then starts
    # loading plotly.js (the page's largest script) before the tables' scripts.
    if _has_rows(result.ranks):
        with per_rank:
            st.subheader("Per rank")
            _chart(html_report.breakdown_figure(result))
            st.dataframe(result.ranks.round(3), width="stretch", hide_index=True)
    with verdict_and_findings:
        level, sentence = health_verdict(result.findings)
        getattr(st, level)(f"Health: {sentence}")
        _findings(result.findings)
    _warnings(result.warnings)
    _raw_traces(ctx)


def _findings(findings: list[Any]) -> None:
    st.subheader(f"Findings ({len(findings)})")
    if not findings:
        st.write("No findings.")
        return
    ordered = sorted(findings, key=lambda f: -(f.cost_ms_per_step or 0.0))
    table = pd.DataFrame(
        {
            "severity": [f.severity for f in ordered],
            "cost ms/step": [round(float(f.cost_ms_per_step or 0.0), 3) for f in ordered],
            "kind": [f.kind for f in ordered],
            "ranks": [", ".join(map(str, f.ranks)) for f in ordered],
            "title": [f.title for f in ordered],
            "fix": [f.fix for f in ordered],
        }
    )
    st.dataframe(table, width="stretch", hide_index=True)
    for f in ordered:
        with st.expander(
            f"[{f.severity}] {f.title} — {float(f.cost_ms_per_step or 0):.3f} ms/step"
        ):
            st.markdown(f"**Fix:** {f.fix}")
            if f.location:
                st.markdown(f"**Location:** `{f.location}`")
            st.json(_jsonable(f.evidence), expanded=False)


def _warnings(warnings: list[str]) -> None:
    if not warnings:
        return
    st.warning(f"{len(warnings)} problem(s) reading this run; showing what could be read.")
    with st.expander("Details"):
        st.code("\n".join(warnings[:200]), language=None)


def _raw_traces(ctx: ViewContext) -> None:
    st.subheader("Raw traces")
    files = runs.trace_files(ctx.ref.path, ctx.roots)
    if not files:
        st.write("This run has no profiler traces (captured without profiling?).")
        return
    name = st.selectbox("Trace file (open in https://ui.perfetto.dev)", list(files))
    path = files[name]
    size_mb = path.stat().st_size / 1e6
    st.download_button(
        f"Download {name} ({size_mb:.1f} MB)",
        data=path.read_bytes(),
        file_name=name,
        mime="application/gzip" if name.endswith(".gz") else "application/json",
    )
    tb_dir = path.parent
    st.markdown(
        f"TensorBoard (torch-tb-profiler): `tensorboard --logdir {tb_dir}` and open the "
        "PyTorch Profiler tab."
    )


# --------------------------------------------------------------------------- Timeline


def timeline(ctx: ViewContext) -> None:
    st.header("Timeline")
    all_ranks = _ranks_of(ctx.result)
    if not all_ranks:
        st.info("No per-rank intervals in this run (no traces and no step table).")
        return
    chosen = st.multiselect("Ranks", all_ranks, default=all_ranks[:8])
    budget = st.select_slider(
        "Max intervals (merged/downsampled beyond this)",
        options=[1000, 2000, 5000, 10000, 20000],
        value=5000,
    )
    if not chosen:
        st.info("Pick at least one rank.")
        return
    subset = None if set(chosen) == set(all_ranks) else tuple(sorted(chosen))
    frame = ctx.timeline_of(ctx.result, ctx.ref, subset, int(budget))
    if not _has_rows(frame):
        st.info("The analysis produced no timeline intervals for these ranks.")
        return
    st.caption(f"{len(frame):,} intervals drawn. Drag to zoom, double-click to reset.")
    _chart(figures.timeline_figure(frame))


def _ranks_of(result: Any) -> list[int]:
    if _has_rows(result.ranks):
        return sorted(int(r) for r in result.ranks["rank"].unique())
    if _has_rows(result.breakdown):
        return sorted(int(r) for r in result.breakdown["rank"].unique())
    return []


# --------------------------------------------------------------------------- Step breakdown


def step_breakdown(ctx: ViewContext) -> None:
    st.header("Step breakdown")
    bd = ctx.result.breakdown
    if not _has_rows(bd):
        st.info("No step breakdown: the run has no ProfilerStep or step table.")
    else:
        ranks = sorted(int(r) for r in bd["rank"].unique())
        chosen = st.multiselect("Ranks", ranks, default=ranks, key="breakdown_ranks")
        part = bd[bd["rank"].isin(chosen)]
        _chart(figures.breakdown_figure(part))
        st.dataframe(part.round(3), width="stretch", hide_index=True)
    if ctx.result.dataloader:
        st.subheader("Data loading")
        _render_mapping(ctx.result.dataloader)


# --------------------------------------------------------------------------- Communication


def communication(ctx: ViewContext) -> None:
    result = ctx.result
    st.header("Communication")
    summary = result.collective_summary
    if _has_rows(summary):
        st.subheader("Collectives by op and process group")
        _chart(figures.busbw_figure(summary))
        st.dataframe(summary.round(3), width="stretch", hide_index=True)
    else:
        st.info("No collectives recorded in this run.")
    if _has_rows(result.collectives):
        with st.expander(f"All collectives ({len(result.collectives):,} rows)"):
            st.dataframe(result.collectives.head(5000), width="stretch", hide_index=True)
    _buckets(result.buckets)
    st.subheader("Stragglers")
    if _has_rows(result.skew):
        _chart(figures.skew_heatmap(result.skew))
    if _has_rows(result.stragglers):
        st.dataframe(result.stragglers.round(3), width="stretch", hide_index=True)
    if not _has_rows(result.skew) and not _has_rows(result.stragglers):
        st.write("No cross-rank collective matching possible (one rank, or no collectives).")


def _buckets(buckets: Any) -> None:
    if not _has_rows(buckets):
        return
    st.subheader("DDP buckets")
    start = next((c for c in ("start_ns", "enqueue_ns") if c in buckets), None)
    label = next((c for c in ("bucket", "index", "seq") if c in buckets), "rank")
    if start and "end_ns" in buckets and buckets[[start, "end_ns"]].notna().all(axis=1).any():
        _chart(figures.bucket_figure(buckets, start, "end_ns", label))
    st.dataframe(buckets.round(3), width="stretch", hide_index=True)


# --------------------------------------------------------------------------- GPU metrics


def gpu_metrics(ctx: ViewContext) -> None:
    result = ctx.result
    st.header("GPU metrics")
    busy = records_frame((result.gpu or {}).get("kernel_busy"))
    if busy is not None:
        st.subheader("GPU kernel busy time (from the traces)")
        _chart(figures.busy_figure(busy))
        st.dataframe(busy.round(3), width="stretch", hide_index=True)
    nvml = records_frame((result.gpu or {}).get("nvml"))
    if nvml is not None:
        st.subheader("NVML summary per GPU")
        st.dataframe(nvml, width="stretch", hide_index=True)
    samples = result.gpu_samples
    if _has_rows(samples):
        st.caption("Red bands: clocks held back (power cap, thermal or HW slowdown).")
        for metric, unit in GPU_METRICS:
            if metric in samples and samples[metric].notna().any():
                _chart(figures.gpu_metric_figure(samples, metric, unit))
    else:
        st.info("No NVML samples (a trace directory, or a run on a machine without GPUs).")
    host = result.host_samples
    if _has_rows(host):
        st.subheader("Host")
        for metric, unit in HOST_METRICS:
            if metric in host and host[metric].notna().any():
                _chart(figures.host_metric_figure(host, metric, unit))


# --------------------------------------------------------------------------- DataParallel


DP_FINDINGS = ("dataparallel_overhead", "gpu0_imbalance", "dp_on_cpu")


def dataparallel(ctx: ViewContext) -> None:
    st.header("DataParallel")
    dp = ctx.result.dataparallel
    if not dp:
        st.info("Not a torch.nn.DataParallel run (no DataParallel.forward in the traces).")
        return
    if dp.get("on_cpu"):
        st.warning(
            "DataParallel ran on CPU: no scatter, replicate or gather happen there, so its "
            "GPU overhead cannot be measured from this run."
        )
    step_ms = _mean_step_ms(ctx.result)
    stages = dp.get("stage_ms_per_step") or {}
    if stages:
        _chart(
            figures.dp_figure(
                {k: float(v) for k, v in stages.items()}, step_ms, dp.get("projected_ddp_step_ms")
            )
        )
    facts = {
        "forward ms/step": dp.get("forward_ms_per_step"),
        "DP overhead ms/step": dp.get("overhead_ms_per_step"),
        "mean step ms": step_ms,
        "projected DDP step ms": dp.get("projected_ddp_step_ms"),
    }
    _render_mapping({k: v for k, v in facts.items() if v is not None})
    for f in ctx.result.findings:
        if f.kind in DP_FINDINGS:
            st.markdown(f"**[{f.severity}] {f.title}** — {float(f.cost_ms_per_step):.3f} ms/step")
            st.markdown(f"Fix: {f.fix}")
            with st.expander("Evidence"):
                st.json(_jsonable(f.evidence), expanded=True)
    if dp.get("projection_assumptions"):
        with st.expander("How the DDP projection is made"):
            for line in dp["projection_assumptions"]:
                st.markdown(f"- {line}")
    rest = {k: v for k, v in dp.items() if k not in ("projection_assumptions",)}
    with st.expander("All DataParallel numbers"):
        st.json(_jsonable(rest), expanded=True)


def _mean_step_ms(result: Any) -> float | None:
    if _has_rows(result.ranks) and "step_ms_mean" in result.ranks:
        return float(result.ranks["step_ms_mean"].astype(float).mean())
    return None


# --------------------------------------------------------------------------- Compare


def _default_pair(refs: list[runs.RunRef]) -> tuple[int, int]:
    """The bench's runs first (a folder with bench.json): DP vs DDP, else single vs DDP;
    otherwise the first two runs."""
    bench = [i for i, r in enumerate(refs) if (r.path.parent / rundir.BENCH).is_file()]
    pool = bench if len(bench) >= 2 else list(range(len(refs)))

    def first(pred: Callable[[str], bool]) -> int | None:
        return next((i for i in pool if pred(refs[i].path.name.lower())), None)

    ddp = first(lambda n: "ddp" in n)
    other = first(lambda n: "dp" in n.replace("ddp", "")) or first(lambda n: "single" in n)
    if ddp is not None and other is not None and ddp != other:
        return other, ddp
    return pool[0], pool[min(1, len(pool) - 1)]


def compare(ctx: ViewContext) -> None:
    st.header("Compare")
    if len(ctx.all_runs) < 2:
        st.info("Give the dashboard at least two runs to compare.")
        return
    labels = [r.label for r in ctx.all_runs]
    ia, ib = _default_pair(ctx.all_runs)
    col_a, col_b = st.columns(2)
    name_a = col_a.selectbox("Run A", labels, index=ia, key="compare_a")
    name_b = col_b.selectbox("Run B", labels, index=ib, key="compare_b")
    res_a, err_a = ctx.result_of(ctx.all_runs[labels.index(name_a)])
    res_b, err_b = ctx.result_of(ctx.all_runs[labels.index(name_b)])
    for err in (err_a, err_b):
        if err:
            st.error(err)
    if res_a is None or res_b is None:
        return
    from gpudiag.analysis.compare import compare as compare_results

    table = compare_results(res_a, res_b).table
    if table.dropna(subset=["a", "b"], how="all").empty:
        st.info("Neither run has per-rank step times to compare.")
    else:
        _chart(figures.compare_figure(table, name_a, name_b))
        shown = table.rename(
            columns={"a": f"A: {name_a}", "b": f"B: {name_b}", "delta": "B − A", "delta_pct": "%"}
        )
        st.dataframe(shown.round(3), width="stretch", hide_index=True)
    for col, res in ((col_a, res_a), (col_b, res_b)):
        with col:
            st.markdown(f"**Findings ({len(res.findings)})**")
            for f in res.findings:
                st.write(f"[{f.severity}] {f.title} — {float(f.cost_ms_per_step or 0):.3f} ms/step")


# --------------------------------------------------------------------------- Code


def lint_rows(lint: rundir.LintReport | None) -> list[rundir.LintDiagnostic]:
    """The diagnostics of a run's lint.json."""
    return list(lint.diagnostics) if lint is not None else []


def lint_table(items: list[rundir.LintDiagnostic], findings: list[Any]) -> pd.DataFrame:
    """Lint findings joined to the runtime finding that measures them (the analysis's
    one join: the rule's ``relates_to``)."""
    rows = []
    for item in items:
        runtime = measured_as(item, findings)
        rows.append(
            {
                "code": item.code,
                "rule": item.rule,
                "severity": item.severity,
                "location": item.location,
                "message": item.message,
                "fix": item.fix,
                "measured as": runtime.kind if runtime else "",
                "runtime cost ms/step": (
                    round(float(runtime.cost_ms_per_step), 3) if runtime else None
                ),
            }
        )
    return pd.DataFrame(rows)


def _script_of(result: Any) -> Path | None:
    script = (result.run or {}).get("script")
    candidates = script if isinstance(script, list) else [script]
    for c in candidates:
        if isinstance(c, str) and c.endswith(".py") and Path(c).is_file():
            return Path(c)
    return None


def code(ctx: ViewContext) -> None:
    st.header("Code")
    lint = ctx.result.lint
    script = _script_of(ctx.result)
    if lint is None and script is not None:
        st.info(f"No lint.json in this run; the traced script is {script}.")
        if st.button(f"Lint {script.name} now (static analysis, nothing is run)"):
            from gpudiag.lint import lint_paths

            lint = rundir.parse_lint(lint_paths([script]).to_json(), str(script))
    if lint is None:
        st.info(
            "No lint result for this run (`gpudiag trace` writes lint.json; "
            "`gpudiag lint train.py` lints a script)."
        )
    items = lint_rows(lint)
    if lint is not None and not items:
        st.success("The linter found no DataParallel/DDP anti-pattern in the traced script.")
    for err in lint.errors if lint is not None else []:
        st.warning(f"{err.path}:{err.line}: {err.message}")
    if items:
        table = lint_table(items, ctx.result.findings)
        st.dataframe(
            table[["code", "rule", "severity", "location", "measured as", "runtime cost ms/step"]],
            width="stretch",
            hide_index=True,
        )
        for item, row in zip(items, table.itertuples(index=False), strict=True):
            cost = row[-1]
            measured = f" — measured: {cost:.3f} ms/step ({row[6]})" if pd.notna(cost) else ""
            with st.container(border=True):
                st.markdown(
                    f"**{row.code} {row.rule}** ({row.severity}) at `{row.location}`{measured}"
                )
                st.write(row.message)
                if item.why:
                    st.caption(f"Why: {item.why}")
                if row.fix:
                    st.markdown(f"**Fix:** {row.fix}")
        costed = table.dropna(subset=["runtime cost ms/step"])
        if len(costed):
            _chart(
                figures.stacked_columns_figure(
                    costed.assign(where=costed["code"] + " " + costed["location"]),
                    "where",
                    ["runtime cost ms/step"],
                    "Measured cost of the lint findings (ms/step)",
                )
            )
    located = [f for f in ctx.result.findings if f.location]
    if located:
        st.subheader("Runtime findings with a source location")
        for f in located:
            st.write(f"`{f.location}` — {f.title} ({float(f.cost_ms_per_step or 0):.3f} ms/step)")


VIEWS: dict[str, Callable[[ViewContext], None]] = {
    "Overview": overview,
    "Timeline": timeline,
    "Step breakdown": step_breakdown,
    "Communication": communication,
    "GPU metrics": gpu_metrics,
    "DataParallel": dataparallel,
    "Compare": compare,
    "Code": code,
}
