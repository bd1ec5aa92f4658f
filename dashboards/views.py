"""One function per dashboard view. Each renders an AnalysisResult (or says plainly
what is missing); none computes analysis of its own.

Every string that comes from a run (device names, paths, titles, fixes, lint fields)
goes through :func:`md` before it reaches anything Streamlit renders as Markdown
(markdown, captions, alerts, labels, metrics, ``st.table`` cells), or is shown with
``st.code`` / ``st.dataframe``, which render plain text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from gpudiag import rundir
from gpudiag.analysis.findings import Finding, measured_as
from gpudiag.analysis.result import AnalysisResult, SpilledTable
from gpudiag.analysis.whatif import Projection
from gpudiag.report import figures
from gpudiag.report.tables import whatif_frame

from . import runs

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


ResultOf = Callable[[runs.RunRef], tuple[AnalysisResult | None, str | None]]
TimelineOf = Callable[[AnalysisResult, runs.RunRef, tuple[int, ...] | None, int], pd.DataFrame]


@dataclass
class ViewContext:
    ref: runs.RunRef
    result: AnalysisResult
    roots: list[Path]
    all_runs: list[runs.RunRef]
    result_of: ResultOf
    timeline_of: TimelineOf


# Every ASCII punctuation character may be backslash-escaped in (GitHub-flavoured)
# Markdown; escaping them all leaves no link, image, code span, emphasis, HTML, math
# ($), directive (:red[...]) or block syntax in run-derived text.
_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def md(value: Any) -> str:
    """``value`` as Markdown that renders literally, on one line."""
    text = " ".join(str(value).split())
    return _MD_SPECIAL.sub(r"\\\1", text)


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


def _metrics(facts: dict[str, Any]) -> None:
    """Label -> value as metrics, four to a row (values escaped: metrics render Markdown)."""
    items = list(facts.items())
    for start in range(0, len(items), 4):
        row = items[start : start + 4]
        for col, (label, value) in zip(st.columns(len(row)), row, strict=True):
            col.metric(label, md(_scalar(value)))


def _table(frame: pd.DataFrame) -> None:
    """A static table whose long text wraps instead of being cut off; every cell is
    escaped (``st.table`` renders cells as Markdown)."""
    st.table(frame.map(md), hide_index=True)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


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
        out = out.rename(columns={c: c.removesuffix("_ns") + " ms (from first)" for c in stamps})
    ns = [c for c in out.columns if str(c).endswith("_ns")]
    for col in ns:
        out[col] = pd.to_numeric(out[col], errors="coerce") / 1e6
    return out.rename(columns={c: str(c).removesuffix("_ns") + "_ms" for c in ns})


# --------------------------------------------------------------------------- Overview


def health_verdict(findings: list[Finding]) -> tuple[str, str]:
    """(level, sentence) from the findings' severities."""
    severities = {f.severity for f in findings}
    if "high" in severities:
        return "error", "Needs attention: at least one high-severity bottleneck."
    if "medium" in severities:
        return "warning", "Some inefficiency: medium-severity findings below."
    if findings:
        return "info", "Healthy, with minor findings."
    return "success", "Healthy: no bottleneck found."


SOURCE_KINDS = {"gpudiag_run": "run dir", "traces": "traces", "summaries": "summaries"}


def overview(ctx: ViewContext) -> None:
    result = ctx.result
    info = result.run
    st.header(f"Overview · {md(ctx.ref.label)}")
    st.caption(md(result.source))
    status = _scalar(info.status)
    if info.exit_code not in (None, 0):
        status += f" (exit {info.exit_code})"
    facts = {
        "World size": info.world_size,
        "Backend": info.backend,
        "Steps analysed": info.steps_analysed,
        "Status": status,
        "Source": SOURCE_KINDS.get(info.kind, info.kind),
    }
    for col, (label, value) in zip(st.columns(len(facts)), facts.items(), strict=True):
        col.metric(label, md(_scalar(value)))
    devices = ", ".join(info.devices) if info.devices else "CPU only (no GPU in the run)"
    st.markdown(f"**Devices:** {md(devices)}")

    verdict_and_findings, per_rank = st.container(), st.container()
    # The chart is sent first though laid out below the findings: the browser then starts
    # loading plotly.js (the page's largest script) before the tables' scripts.
    if _has_rows(result.ranks):
        with per_rank:
            st.subheader("Per rank")
            _chart(figures.rank_breakdown_figure(result.ranks))
            st.dataframe(result.ranks.round(3), width="stretch", hide_index=True)
    with verdict_and_findings:
        level, sentence = health_verdict(result.findings)
        getattr(st, level)(f"Health: {sentence}")
        _findings(result.findings)
        _whatif(result.whatif)
    _warnings(result.warnings)
    _raw_traces(ctx)


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    """The findings in the analysis' order (failures first, then most costly: the same
    order as the terminal report and the JSON)."""
    return pd.DataFrame(
        {
            "severity": [f.severity for f in findings],
            "cost ms/step": [f"{float(f.cost_ms_per_step or 0.0):.3f}" for f in findings],
            "kind": [f.kind for f in findings],
            "ranks": [", ".join(map(str, f.ranks)) for f in findings],
            "title": [f.title for f in findings],
            "fix": [f.fix for f in findings],
        }
    )


def _findings(findings: list[Finding]) -> None:
    st.subheader(f"Findings ({len(findings)})")
    if not findings:
        st.write("No findings.")
        return
    _table(findings_table(findings))
    for f in findings:
        with st.expander(
            f"{md(f.severity)}: {md(f.title)} ({float(f.cost_ms_per_step or 0):.3f} ms/step)"
        ):
            if f.location:
                st.markdown("**Location**")
                st.code(f.location, language=None)
            st.markdown("**Evidence**")
            st.json(_jsonable(f.evidence), expanded=True)


def _whatif(projections: list[Projection]) -> None:
    if not projections:
        return
    st.subheader("What if: projected step time per fix")
    _table(whatif_frame(projections))


def _warnings(warnings: list[str]) -> None:
    if not warnings:
        return
    st.warning(f"{len(warnings)} problem(s) reading this run; showing what could be read.")
    with st.expander("Details"):
        st.code("\n".join(warnings[:200]), language=None)


def human_size(n_bytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes} bytes"


def _reader(path: Path) -> Callable[[], bytes]:
    """The file's bytes, read only when the browser asks for the download (a regular
    file only: what replaced it since the listing is never read; nothing then)."""

    def read() -> bytes:
        try:
            with rundir.open_regular(path) as fh:
                return fh.read()
        except OSError:
            return b""

    return read


def _raw_traces(ctx: ViewContext) -> None:
    st.subheader("Raw traces")
    files = runs.trace_files(ctx.ref.path, ctx.roots)
    if not files:
        st.write("This run has no profiler traces (captured without profiling?).")
        return
    name = st.selectbox("Trace file (open in https://ui.perfetto.dev)", list(files))
    if name is None:
        return
    path = files[name]
    found = rundir.path_stat(path)
    st.download_button(
        f"Download {md(name)} ({human_size(found.st_size if found else 0)})",
        data=_reader(path),
        file_name=name,
        mime="application/gzip" if name.endswith(".gz") else "application/json",
        on_click="ignore",
    )
    st.markdown("TensorBoard (torch-tb-profiler): run this and open the PyTorch Profiler tab.")
    st.code(f"tensorboard --logdir {path.parent}", language="bash")


# --------------------------------------------------------------------------- Timeline


def timeline(ctx: ViewContext) -> None:
    st.header("Timeline")
    all_ranks = _ranks_of(ctx.result)
    if not all_ranks:
        st.info("No per-rank intervals in this run (no traces and no step table).")
        return
    drawn = ctx.result.timeline_ranks()  # a large run's: named by findings, slowest, fastest
    chosen = st.multiselect("Ranks", all_ranks, default=(drawn or all_ranks)[:8])
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
    shown = ""
    if subset is None and drawn is not None:
        shown = (
            f" {len(drawn)} of {len(all_ranks)} ranks: those named by findings, then the "
            "slowest and the fastest."
        )
    st.caption(f"{len(frame):,} intervals drawn.{shown} Drag to zoom, double-click to reset.")
    _chart(figures.timeline_figure(frame))


def _ranks_of(result: AnalysisResult) -> list[int]:
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
        _chart(figures.step_breakdown_figure(part))
        st.dataframe(part.round(3), width="stretch", hide_index=True)
    _data_loading(ctx.result)


def data_wait_tables(result: AnalysisResult) -> dict[str, pd.DataFrame]:
    """The data-loading result as tables: every step (steps table), the profiled window
    (trace DataLoader events), and host synchronisation points."""
    dl = result.dataloader
    tables: dict[str, pd.DataFrame] = {}
    if dl.run:
        tables["Data wait over every step (steps table)"] = pd.DataFrame(
            [{"rank": rank, **asdict(row)} for rank, row in sorted(dl.run.items())]
        )
    if dl.trace:
        tables["Data wait in the profiled window (DataLoader events)"] = pd.DataFrame(
            [asdict(t) for t in dl.trace]
        )
    if dl.host_sync:
        tables["Host synchronisation in the profiled steps"] = pd.DataFrame(
            [
                {
                    "rank": h.rank,
                    "count_per_step": h.count_per_step,
                    "ms_per_step": h.ms_per_step,
                    "calls": ", ".join(
                        f"{name} ×{calls.count}"
                        for name, calls in sorted(h.by_name.items(), key=lambda kv: -kv[1].total_ms)
                    ),
                }
                for h in dl.host_sync
            ]
        )
    return tables


def _data_loading(result: AnalysisResult) -> None:
    tables = data_wait_tables(result)
    if not tables:
        return
    st.subheader("Data loading")
    for title, frame in tables.items():
        st.markdown(f"**{title}**")
        st.dataframe(frame.round(3), width="stretch", hide_index=True)


# --------------------------------------------------------------------------- Communication


# Rows of a per-call table (every collective of every rank) a view reads and shows.
_SHOWN_ROWS = 5000


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
    if len(result.collectives):
        with st.expander(f"All collectives ({len(result.collectives):,} rows)"):
            shown = readable_times(result.collectives.frame(rows=_SHOWN_ROWS))
            st.dataframe(shown, width="stretch", hide_index=True)
    _buckets(result.buckets)
    st.subheader("Stragglers")
    if len(result.skew):
        _chart(figures.skew_heatmap(result.skew.frame(figures.SKEW_HEATMAP_READS)))
    if _has_rows(result.stragglers):
        st.dataframe(result.stragglers.round(3), width="stretch", hide_index=True)
    if not len(result.skew) and not _has_rows(result.stragglers):
        st.write("No cross-rank collective matching possible (one rank, or no collectives).")


def bucket_table(buckets: pd.DataFrame) -> pd.DataFrame:
    """DDP buckets for reading: sizes in MiB, times in ms (no raw nanosecond stamps)."""
    out = readable_times(buckets)
    if "bytes" in out:
        out.insert(
            list(out.columns).index("bytes"),
            "MiB",
            pd.to_numeric(out["bytes"], errors="coerce") / 2**20,
        )
        out = out.drop(columns="bytes")
    return out.rename(columns={"start_ms": "start ms (in step)", "dur_ms": "duration ms"})


def _buckets(kept: SpilledTable) -> None:
    if not len(kept):
        return
    st.subheader("DDP buckets")
    buckets = kept.frame(rows=_SHOWN_ROWS)
    if len(kept) > len(buckets):
        st.caption(f"The first {len(buckets):,} of {len(kept):,} buckets (rank, then step).")
    start = next((c for c in ("start_ns", "enqueue_ns") if c in buckets), None)
    label = next((c for c in ("bucket", "index", "seq") if c in buckets), "rank")
    if start and "end_ns" in buckets and buckets[[start, "end_ns"]].notna().all(axis=1).any():
        _chart(figures.bucket_figure(buckets, start, "end_ns", label))
    st.dataframe(bucket_table(buckets).round(3), width="stretch", hide_index=True)


# --------------------------------------------------------------------------- GPU metrics


def gpu_metrics(ctx: ViewContext) -> None:
    result = ctx.result
    st.header("GPU metrics")
    if result.gpu.kernel_busy:
        busy = pd.DataFrame([asdict(b) for b in result.gpu.kernel_busy])
        st.subheader("GPU kernel busy time (from the traces)")
        _chart(figures.busy_figure(busy))
        st.dataframe(busy.round(3), width="stretch", hide_index=True)
    if result.gpu.nvml:
        nvml = pd.DataFrame([n.to_json() for n in result.gpu.nvml])
        if "throttle_share_by_reason" in nvml:
            nvml["throttle_share_by_reason"] = nvml["throttle_share_by_reason"].map(
                lambda d: (
                    ", ".join(f"{k} {v:.0%}" for k, v in d.items()) if isinstance(d, dict) else ""
                )
            )
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
NOT_DP = (
    "This run does not use `torch.nn.DataParallel` (no `DataParallel.forward` in its "
    "traces), so there is no DataParallel overhead to measure here."
)
NO_DP_MODEL = (
    "gpudiag has no model that predicts what DataParallel would cost from a DDP run: its "
    "per-step scatter, module replication, gather and gradient reduction onto GPU 0 depend "
    "on the model's size, the batch and the links between the GPUs, and happen only on "
    "CUDA (on CPU, DataParallel is a plain call). To see it, record it:"
)
RECORD_DP = (
    "# your script with the model wrapped in nn.DataParallel, one process, several GPUs\n"
    "gpudiag trace --nproc-per-node 1 train_dp.py\n"
    "# or the reference model as single-GPU, DataParallel and DDP runs side by side\n"
    "gpudiag bench --device cuda"
)


def dataparallel(ctx: ViewContext) -> None:
    st.header("DataParallel")
    dp = ctx.result.dataparallel
    if dp is None:
        st.info(NOT_DP)
        st.markdown(NO_DP_MODEL)
        st.code(RECORD_DP, language="bash")
        st.markdown(
            "Then compare the two runs in the **Compare** view (step time and where it goes)."
        )
        return
    if dp.on_cpu:
        st.warning(
            "DataParallel ran on CPU: no scatter, replicate or gather happen there, so its "
            "GPU overhead cannot be measured from this run."
        )
    step_ms = ctx.result.step_ms
    shown_step = step_ms if step_ms == step_ms else None  # NaN: no step time
    if dp.stage_ms_per_step:
        _chart(figures.dp_figure(dict(dp.stage_ms_per_step), shown_step, dp.projected_ddp_step_ms))
    facts = {
        "forward ms/step": dp.forward_ms_per_step,
        "DP overhead ms/step": dp.overhead_ms_per_step,
        "mean step ms": shown_step,
        "projected DDP step ms": dp.projected_ddp_step_ms,
    }
    _metrics({k: v for k, v in facts.items() if v is not None})
    for f in ctx.result.findings:
        if f.kind in DP_FINDINGS:
            st.markdown(
                f"**{md(f.severity)}: {md(f.title)}** ({float(f.cost_ms_per_step):.3f} ms/step)"
            )
            st.markdown(f"Fix: {md(f.fix)}")
            with st.expander("Evidence"):
                st.json(_jsonable(f.evidence), expanded=True)
    if dp.projection_assumptions:
        with st.expander("How the DDP projection is made"):
            for line in dp.projection_assumptions:
                st.markdown(f"- {md(line)}")
    stages = pd.DataFrame(
        {
            "stage": list(dp.stage_ms_per_step),
            "ms per step": list(dp.stage_ms_per_step.values()),
            "events": [dp.stage_events.get(k, 0) for k in dp.stage_ms_per_step],
        }
    )
    st.dataframe(stages.round(3), width="stretch", hide_index=True)


# --------------------------------------------------------------------------- Compare


def _default_pair(refs: list[runs.RunRef]) -> tuple[int, int]:
    """The bench's runs first (a folder with bench.json): DP vs DDP, else single vs DDP;
    otherwise the first two runs."""
    bench = [i for i, r in enumerate(refs) if rundir.is_regular_file(r.path.parent / rundir.BENCH)]
    pool = bench if len(bench) >= 2 else list(range(len(refs)))

    def first(pred: Callable[[str], bool]) -> int | None:
        return next((i for i in pool if pred(refs[i].path.name.lower())), None)

    ddp = first(lambda n: "ddp" in n)
    other = first(lambda n: "dp" in n.replace("ddp", "")) or first(lambda n: "single" in n)
    if ddp is not None and other is not None and ddp != other:
        return other, ddp
    return pool[0], pool[min(1, len(pool) - 1)]


def compare_pair(refs: list[runs.RunRef], selected: runs.RunRef) -> tuple[int, int]:
    """Run A is the run selected in the sidebar; run B its natural partner: the other
    run of the default pair when A is in it, else the pair's DDP run, else the next run."""
    a = refs.index(selected)
    pa, pb = _default_pair(refs)
    if a == pa:
        return a, pb
    if a == pb:
        return a, pa
    b = pb if pb != a else pa
    if b == a:
        b = (a + 1) % len(refs)
    return a, b


def compare(ctx: ViewContext) -> None:
    st.header("Compare")
    if len(ctx.all_runs) < 2:
        st.info("Give the dashboard at least two runs to compare.")
        return
    labels = [r.label for r in ctx.all_runs]
    ia, ib = compare_pair(ctx.all_runs, ctx.ref)
    col_a, col_b = st.columns(2)
    # Keyed by the selected run: choosing another run in the sidebar starts from it again.
    name_a = col_a.selectbox("Run A", labels, index=ia, key=f"compare_a:{ctx.ref.label}")
    name_b = col_b.selectbox("Run B", labels, index=ib, key=f"compare_b:{ctx.ref.label}")
    if name_a is None or name_b is None:
        return
    res_a, err_a = ctx.result_of(ctx.all_runs[labels.index(name_a)])
    res_b, err_b = ctx.result_of(ctx.all_runs[labels.index(name_b)])
    for err in (err_a, err_b):
        if err:
            st.error(md(err))
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
                st.markdown(
                    f"{md(f.severity)}: {md(f.title)} "
                    f"({float(f.cost_ms_per_step or 0):.3f} ms/step)"
                )


# --------------------------------------------------------------------------- Code


def lint_rows(lint: rundir.LintReport | None) -> list[rundir.LintDiagnostic]:
    """The diagnostics of a run's lint.json."""
    return list(lint.diagnostics) if lint is not None else []


def lint_table(items: list[rundir.LintDiagnostic], findings: list[Finding]) -> pd.DataFrame:
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


def _script_of(result: AnalysisResult) -> Path | None:
    script = result.run.script
    candidates = script if isinstance(script, list) else [script]
    for c in candidates:
        if isinstance(c, str) and c.endswith(".py") and rundir.is_regular_file(c):
            return Path(c)
    return None


def code(ctx: ViewContext) -> None:
    st.header("Code")
    lint = ctx.result.lint
    script = _script_of(ctx.result)
    if lint is None and script is not None:
        st.info(f"No lint.json in this run; the traced script is {md(script)}.")
        if st.button(f"Lint {md(script.name)} now (static analysis, nothing is run)"):
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
        st.warning(md(f"{err.path}:{err.line}: {err.message}"))
    if items:
        table = lint_table(items, ctx.result.findings)
        st.dataframe(
            table[["code", "rule", "severity", "location", "measured as", "runtime cost ms/step"]],
            width="stretch",
            hide_index=True,
        )
        for item, row in zip(items, table.itertuples(index=False), strict=True):
            cost = row[-1]
            measured = f" — measured: {cost:.3f} ms/step ({md(row[6])})" if pd.notna(cost) else ""
            with st.container(border=True):
                st.markdown(
                    f"**{md(row.code)} {md(row.rule)}** ({md(row.severity)}) "
                    f"at {md(row.location)}{measured}"
                )
                st.text(str(row.message))
                if item.why:
                    st.caption(f"Why: {md(item.why)}")
                if row.fix:
                    st.markdown(f"**Fix:** {md(row.fix)}")
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
            st.markdown(
                f"{md(f.location)} — {md(f.title)} ({float(f.cost_ms_per_step or 0):.3f} ms/step)"
            )


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
