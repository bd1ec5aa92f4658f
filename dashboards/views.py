"""One function per dashboard view. Each renders an AnalysisResult (or says plainly
what is missing); none computes analysis of its own.

Every string that comes from a run (device names, paths, titles, fixes, lint fields)
goes through :func:`md` before it reaches anything Streamlit renders as Markdown
(markdown, captions, alerts, labels, metrics, ``st.table`` cells), or is shown with
``st.code`` / ``st.dataframe``, which render plain text.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from gpudiag import rundir
from gpudiag.analysis.compare import RecordedShape, comparable_recordings, recorded_shape
from gpudiag.analysis.compare import compare as compare_results
from gpudiag.analysis.findings import Finding, measured_as
from gpudiag.analysis.result import AnalysisResult, RunInfo, SpilledTable
from gpudiag.analysis.whatif import Projection
from gpudiag.numfmt import plural
from gpudiag.report import (
    collective_spread,
    colours,
    figures,
    numbers,
    rank_means,
    rank_words,
    wait_note,
    windows,
)
from gpudiag.report import overview as report_overview
from gpudiag.report import tables as report_tables
from gpudiag.report.tables import WHATIF_DIGITS, whatif_frame

from . import runs
from .widgets import dataframe as _dataframe
from .widgets import md
from .widgets import metrics as _metrics
from .widgets import scalar as _scalar
from .widgets import table as _table
from .widgets import wide_dataframe as _wide_dataframe

if TYPE_CHECKING:  # annotations only: the dashboard loads the linter when it lints
    from gpudiag.lint.report import LintDiagnostic, LintReport

GPU_METRICS = (
    ("util_gpu", "%"),
    ("sm_clock_mhz", "MHz"),
    ("power_w", "W"),
    ("mem_used", "bytes"),
    ("temp_c", "°C"),
    ("pcie_tx_kbs", "KB/s"),
    ("nvlink_tx_kbs", "KB/s"),
)
BUSY_HEADERS = {
    "busy_fraction": f"{report_overview.GPU_BUSY} %",
    "compute_fraction": f"{report_overview.COMPUTE_KERNELS} %",
    "window_ms": "window ms",
    # not the gpu_idle finding's GPU idle, which leaves data loading out (75.28 beside
    # 69.59 ms/step under one label on Megatron: probe 31j, D6)
    "idle_ms_per_step": "GPU idle, data loading included ms/step",
    "startup_ms": "start-up ms (before the first kernel)",
}
# The key columns first, so they are in view in a 1280-1440 px window: GPU idle was the
# sixth column, past the right edge at 1440 px on the GPU sets (probe 31m).
BUSY_ORDER = (
    "rank",
    "idle_ms_per_step",
    "busy_fraction",
    "compute_fraction",
    "steps",
    "window_ms",
    "startup_ms",
)
HOST_METRICS = (
    ("cpu_percent", "% of all cores"),
    ("proc_cpu_percent", "% of one core, summed over cores"),
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
    # shows another run (the sidebar's select and ?run=), for Compare's Run A
    select_run: Callable[[str], None] = lambda label: None


def _has_rows(frame: Any) -> bool:
    return isinstance(frame, pd.DataFrame) and len(frame) > 0


def _chart(fig: Any) -> None:
    st.plotly_chart(fig, width="stretch", config={"displaylogo": False})


# --------------------------------------------------------------------------- Overview


SOURCE_KINDS = {"gpudiag_run": "run dir", "traces": "traces", "summaries": "summaries"}
# The view each finding's evidence is clearest in (a button under the verdict).
EVIDENCE_VIEW = {
    "straggler": ("Communication", "arrival skew per collective"),
    "exposed_communication": ("Communication", "collectives and all-reduces per step"),
    "sync_point": ("Communication", "collectives and all-reduces per step"),
    "bucket_size": ("Communication", "DDP buckets"),
    "gpu_idle": ("GPU metrics", "GPU busy per rank"),
    "gpu_throttled": ("GPU metrics", "clocks and throttling"),
    "dataloader_stall": ("Step breakdown", "data wait per step"),
    "dataparallel_overhead": ("DataParallel", "DataParallel stages"),
    "gpu0_imbalance": ("DataParallel", "DataParallel stages"),
}


def _go_to(view: str) -> None:
    st.session_state["view"] = view


def _facts_line(result: AnalysisResult, label: str) -> str:
    info = result.run
    world = plural(info.world_size, "rank") if info.world_size else "world size unknown"
    devices = report_overview.devices_text(info)
    bits = [world, _scalar(info.backend), devices, report_overview.steps_window(result)]
    if info.status:
        status = f"status {info.status}"
        if info.exit_code not in (None, 0):
            status += f" (exit {info.exit_code})"
        bits.append(status)
    bits.append(SOURCE_KINDS.get(info.kind, info.kind))
    return " · ".join(bits)


def first_screen(ctx: ViewContext) -> None:
    """The answer: the step time, the top finding as one verdict line with its fix,
    and where each rank's step goes, the named rank outlined."""
    result = ctx.result
    verdict = report_overview.verdict(result)
    label, value = report_overview.step_time(result)
    col_step, col_verdict = st.columns([1, 4])
    col_step.metric("Step time", md(value), help=md(label))
    col_step.caption(md(label))
    if result.run.status:
        status = str(result.run.status)
        col_step.metric("Status", md(status))  # a metric cuts a long value: the code below
        if result.run.exit_code not in (None, 0):
            col_step.caption(md(f"exit code {result.run.exit_code}"))
    with col_verdict:
        problems = report_overview.reading_problems(result)
        if problems:  # above the verdict: what the numbers leave out
            st.warning(md(problems))
        slowed = windows.slowdown_note(result)
        if slowed:  # the profiled steps' numbers inflated by the profiler
            st.caption(md(slowed))
        text = f"**{md(verdict.headline)}**"
        if verdict.fix:
            text += f"  \n**Fix:** {md(verdict.fix)}"
        getattr(st, verdict.level)(text)
        target = EVIDENCE_VIEW.get(verdict.finding.kind) if verdict.finding else None
        if target is not None:
            st.button(
                f"Evidence: {target[1]} ({target[0]}) →",
                on_click=_go_to,
                args=(target[0],),
                key="evidence_link",
            )
    if _has_rows(result.ranks):
        parts = report_overview.rank_parts(result)
        title = report_overview.rank_chart_title(result)
        st.markdown(figures.rank_parts_svg(parts, title), unsafe_allow_html=True)
        if (
            not parts.split
            and "comm_exposed" in parts.frame
            and parts.frame["comm_exposed"].sum() > 0
        ):
            st.caption(
                "Exposed communication is drawn whole: not every rank's wait for its peers "
                "could be measured (a rank's trace missing, or collectives not matched "
                "across ranks), so waiting cannot be told from transfer here."
            )
        note = wait_note.page_note(result, verdict)
        if note:
            st.caption(md(note))
        if parts.named and verdict.finding is not None:
            st.caption(
                f"◀ outlined: {md(numbers.ranks(parts.named))}, named by the top finding "
                f"({md(verdict.finding.kind)}). Hover a segment for its value."
            )
        st.caption(report_overview.SHARED_COLOURS_NOTE)


def _view_header(ctx: ViewContext, name: str, whose: str = "") -> None:
    """``Timeline · run label``: every view names the run it shows, as the Overview did
    alone (a reader who came by the sidebar or a shared URL saw "Timeline" and no run:
    probe 31m)."""
    st.header(f"{name} · {whose}{md(ctx.ref.label)}")


def overview(ctx: ViewContext) -> None:
    result = ctx.result
    _view_header(ctx, "Overview")
    st.caption(md(_facts_line(result, ctx.ref.label)) + " · " + md(result.source))
    first_screen(ctx)
    _findings(result.findings, report_overview.no_findings_text(result), result.run)
    _whatif(result.whatif)
    if _has_rows(result.ranks):
        st.subheader("Per rank (ms per step, mean over the profiled steps)")
        table = report_overview.rank_table(result)
        _wide_dataframe(table, report_overview.rank_table_digits())
    _warnings(result.warnings)
    _raw_traces(ctx)


def findings_table(findings: list[Finding], run: RunInfo | None = None) -> pd.DataFrame:
    """The findings in the reports' one order (failures, then severity, then cost: as
    the terminal and HTML reports list them), their ranks in the reports' words."""
    ordered = report_overview.ordered_findings(findings)
    return pd.DataFrame(
        {
            "severity": [f.severity for f in ordered],
            "cost ms/step": [numbers.num(f.cost_ms_per_step) for f in ordered],
            "kind": [f.kind for f in ordered],
            "ranks": [rank_words.finding_ranks(f, run) for f in ordered],
            "title": [f.title for f in ordered],
            "fix": [f.fix for f in ordered],
        }
    )


def _evidence(f: Finding) -> None:
    if f.location:
        st.markdown(f"**Location:** {md(f.location)}")
    st.markdown("**Evidence**")
    st.markdown("\n".join(f"- {md(line)}" for line in report_overview.evidence_lines(f.evidence)))


def _findings(findings: list[Finding], no_findings: str, run: RunInfo | None = None) -> None:
    st.subheader(f"Findings ({len(findings)})")
    if not findings:
        st.text(no_findings)
        return
    _table(findings_table(findings, run))
    for f in report_overview.ordered_findings(findings):
        with st.expander(f"{md(f.severity)}: {md(f.title)}{report_overview.cost_suffix(f)}"):
            _evidence(f)


def _whatif(projections: list[Projection]) -> None:
    if not projections:
        return
    st.subheader("What if: projected step time per fix")
    _table(numbers.frame_text(whatif_frame(projections), WHATIF_DIGITS))


_SHOWN_WARNINGS = 200  # reading problems listed in the Overview's Details


def _warnings(warnings: list[str]) -> None:
    if not warnings:
        return
    st.warning(
        f"Warnings: {len(warnings)} problem(s) reading this run; showing what could be read."
    )
    with st.expander("Warnings"):
        if len(warnings) > _SHOWN_WARNINGS:
            st.caption(f"Showing the first {_SHOWN_WARNINGS} of {len(warnings):,} problems.")
        st.text("\n".join(warnings[:_SHOWN_WARNINGS]))


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
        f"Download {md(name)} ({numbers.size(found.st_size if found else 0)})",
        data=_reader(path),
        file_name=name,
        mime="application/gzip" if name.endswith(".gz") else "application/json",
        on_click="ignore",
    )
    st.markdown("TensorBoard (torch-tb-profiler): run this and open the PyTorch Profiler tab.")
    st.text(f"tensorboard --logdir {shlex.quote(str(path.parent))}")


# --------------------------------------------------------------------------- Timeline


def timeline(ctx: ViewContext) -> None:
    _view_header(ctx, "Timeline")
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
    elif subset is not None:
        shown = f" {len(subset)} of {len(all_ranks)} ranks: those picked above."
    st.caption(f"{len(frame):,} intervals drawn.{shown} Drag to zoom, double-click to reset.")
    _chart(figures.timeline_figure(frame, gpu=bool(ctx.result.run.has_gpu_trace)))


def _ranks_of(result: AnalysisResult) -> list[int]:
    if _has_rows(result.ranks):
        return sorted(int(r) for r in result.ranks["rank"].unique())
    if _has_rows(result.breakdown):
        return sorted(int(r) for r in result.breakdown["rank"].unique())
    return []


# --------------------------------------------------------------------------- Step breakdown


def step_breakdown(ctx: ViewContext) -> None:
    _view_header(ctx, "Step breakdown")
    bd = ctx.result.breakdown
    if not _has_rows(bd):
        st.info("No step breakdown: the run has no ProfilerStep or step table.")
    else:
        ranks = sorted(int(r) for r in bd["rank"].unique())
        chosen = st.multiselect("Ranks", ranks, default=ranks, key="breakdown_ranks")
        part = bd[bd["rank"].isin(chosen)]
        labels = report_overview.run_labels(ctx.result)
        _chart(
            figures.step_breakdown_figure(
                report_overview.step_parts(ctx.result, part), labels=labels
            )
        )
        st.caption("Per profiled step (ms); the Overview's per-rank chart is their mean.")
        shown = part.rename(
            columns={"step_ms": "step ms", **{k: f"{v} ms" for k, v in labels.items()}}
        )
        _wide_dataframe(shown, {"rank": 0, "step": 0})
        _exposed_split(ctx.result, chosen)
    _data_loading(ctx.result)


def _exposed_split(result: AnalysisResult, chosen: list[int]) -> None:
    """The Overview's split of exposed communication, for the ranks shown: the wait for
    late peers is measured per rank over the profiled steps, not per step, so the steps
    above show the sum under the name the Overview gives it (browser probe of issue 31,
    L: one label per meaning)."""
    if "comm_exposed" not in result.breakdown:
        return
    parts = report_overview.rank_parts(result)
    labels = parts.labels
    if not parts.split:
        st.caption(
            f"{md(labels['comm_exposed'].capitalize())}: not split into "
            f"{md(labels['comm_wait'])} and transfer for this run (not every rank's wait "
            "could be measured), as in the Overview."
        )
        return
    st.caption(
        f"{md(labels['comm_exposed'].capitalize())} per step (the table above) is the "
        f"Overview's {md(labels['comm_wait'])} + {md(labels['comm_transfer'])}. The wait is "
        "measured per rank over the profiled steps, not per step: the chart gives each step "
        "its rank's share of waiting (below, the Overview chart's numbers) of its own "
        "exposed time, so a rank's steps average to its Overview column."
    )
    frame = parts.frame[parts.frame["rank"].isin(chosen)]
    keys = ["comm_wait", "comm_transfer"]
    split = frame[["rank", *keys]].assign(total=frame[keys].sum(axis=1))
    headers = {k: f"{labels[k]} ms/step" for k in keys}
    headers["total"] = f"{labels['comm_exposed']} ms/step"
    _dataframe(split.rename(columns=headers), {"rank": 0})


def _data_loading(result: AnalysisResult) -> None:
    tables = report_tables.data_wait_frames(result.dataloader)
    if not tables:
        return
    st.subheader("Data loading")
    for title, frame in tables.items():
        st.markdown(f"**{title}**")
        _dataframe(frame)
        if title == report_tables.DATA_WAIT_PROFILED:
            st.caption(report_tables.DATA_WAIT_PROFILED_NOTE)


# --------------------------------------------------------------------------- Communication


# Rows of a per-call table (every collective of every rank) a view reads and shows.
_SHOWN_ROWS = 5000


def communication(ctx: ViewContext) -> None:
    result = ctx.result
    _view_header(ctx, "Communication")
    _skew(result)
    summary = result.collective_summary
    st.subheader("Collectives by op and process group")
    if _has_rows(summary):
        st.caption(
            "Size: the median of one call. Calls/rank: over the steps its header names "
            "(every step, from the run's tables, where they hold the calls' times or no "
            "trace was recorded; else the profiled steps). " + collective_spread.WALL_TEXT
        )
        if "peak_gbs" in summary and summary["peak_gbs"].notna().any():
            _chart(figures.busbw_figure(summary))
        else:
            st.caption("No link peak known for these devices: bus bandwidth is in the table only.")
        shown = report_overview.collectives_frame(
            summary, result.collective_wall, windows.collective_window(result)
        )
        _dataframe(shown, report_overview.collective_digits(shown))
    else:
        st.info("No collectives recorded in this run.")
    _buckets(result.buckets, result.run)
    if len(result.collectives):
        with st.expander(f"All collectives ({len(result.collectives):,} rows)"):
            calls = result.collectives.frame(rows=_SHOWN_ROWS)
            if len(result.collectives) > len(calls):
                st.caption(
                    f"Showing {len(calls):,} of {len(result.collectives):,} rows: the first "
                    f"{len(calls):,}, rank by rank."
                )
            shown = report_tables.collective_calls_frame(calls)
            _dataframe(shown, report_tables.COLLECTIVE_CALL_DIGITS)


def _skew(result: AnalysisResult) -> None:
    """The arrival skew first: the clearest evidence of a straggler."""
    st.subheader("Stragglers: who arrives last at each collective")
    straggler = next((f for f in result.findings if f.kind == "straggler"), None)
    if straggler is not None:
        st.markdown(f"**{md(straggler.title)}**{report_overview.cost_suffix(straggler)}")
    if len(result.skew):
        skew = result.skew.frame(figures.SKEW_HEATMAP_READS)
        _chart(figures.skew_heatmap(skew))
        left_out = figures.skew_shown_text(figures.MAX_SKEW_COLUMNS, figures.skew_columns(skew))
        if left_out:
            st.caption(md(left_out.capitalize() + "."))
    if _has_rows(result.stragglers):
        with st.expander("Per rank: arrival skew and the wait it causes"):
            st.caption(
                "The wait here is every collective's, from this rank's arrival to the last "
                "rank's, overlapped with compute or not, over every matched step; the "
                "Overview's 'waiting for late peers' is the exposed part, in the profiled steps."
            )
            _dataframe(
                report_overview.straggler_table(result.stragglers), report_overview.STRAGGLER_DIGITS
            )
    if not len(result.skew) and not _has_rows(result.stragglers):
        st.write("No cross-rank collective matching possible (one rank, or no collectives).")


def _buckets(kept: SpilledTable, run: RunInfo) -> None:
    """The all-reduces of each step, named as the analysis names them
    (RunInfo.allreduce_label: DDP's gradient buckets only where the run shows DDP)."""
    if not len(kept):
        return
    st.subheader(f"All-reduces per step, in issue order: {md(run.allreduce_label)}")
    if run.ddp_evidence:
        st.caption(f"DDP's gradient buckets: {md(run.ddp_evidence)}.")
    else:
        st.caption(
            "Nothing in this run shows DDP (no DDP logging data, no DistributedDataParallel "
            "or Reducer names in its traces): these are all-reduce calls, not DDP buckets "
            "(a tensor-parallel run's layer all-reduces, for one)."
        )
    buckets = kept.frame(rows=_SHOWN_ROWS)
    if len(kept) > len(buckets):
        st.caption(f"The first {len(buckets):,} of {len(kept):,} calls (rank, then step).")
    # the chart's lanes overlay these steps; the table has a row per rank and step of
    # them: one window, said for both (probe 31m)
    window = windows.steps_text(buckets)
    if {"start_ms", "dur_ms", "bucket"} <= set(buckets.columns) and buckets["dur_ms"].notna().any():
        _bucket_chart(buckets)
        if window:
            st.caption(md(f"Each lane: that call in each of {window}, every rank's, overlaid."))
    with st.expander(f"Table: a row per rank and call in each of {window}" if window else "Table"):
        _dataframe(report_tables.bucket_frame(buckets, bool(run.ddp_evidence)))


def _bucket_chart(buckets: pd.DataFrame) -> None:
    """The lane chart, ten calls at a time: past about ten lanes, lanes and labels
    overlapped (a Megatron TP step's 84 calls on 8 ranks: probe N9)."""
    pages = figures.bucket_pages(buckets)
    lanes = figures.bucket_lanes(buckets)
    first = 0
    if len(pages) > 1:
        first = int(
            st.selectbox(
                f"Calls shown ({figures.LANES_PER_PAGE} at a time, of {lanes} per step)",
                pages,
                format_func=lambda k: figures.bucket_page_name(k, lanes),
                key="bucket_page",
            )
            or 0
        )
    _chart(figures.bucket_figure(buckets, first))
    left_out = figures.bucket_shown_text(buckets, first)
    if left_out:  # the chart's title says it too; the table below has every call
        st.caption(
            md(f"{left_out.capitalize()}: pick others above; the table below lists every call.")
        )


# --------------------------------------------------------------------------- GPU metrics


def gpu_metrics(ctx: ViewContext) -> None:
    result = ctx.result
    _view_header(ctx, "GPU metrics")
    if result.gpu.kernel_busy:
        busy = pd.DataFrame([asdict(b) for b in result.gpu.kernel_busy])
        st.subheader("GPU kernel busy time (from the traces)")
        _chart(figures.busy_figure(busy))
        st.caption(
            "GPU idle: no kernel, copy or collective on the device. Per rank it is the "
            "Overview chart's data loading (GPU idle) + GPU idle · host busy + GPU idle · "
            "host idle; the gpu_idle finding counts the last two (data loading has its own)."
        )
        st.caption(report_overview.GPU_COMPUTE_NOTE)
        shown = busy.assign(
            busy_fraction=100 * busy["busy_fraction"],
            compute_fraction=100 * busy["compute_fraction"],
        )
        shown = shown[[c for c in BUSY_ORDER if c in shown]].rename(columns=BUSY_HEADERS)
        _dataframe(shown, {"rank": 0, "steps": 0})
    if result.gpu.nvml:
        st.subheader("NVML summary per GPU")
        nvml = report_tables.nvml_frame(result.gpu.nvml)
        _dataframe(nvml)
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


def _step_label(ctx: ViewContext) -> str:
    """The step the shares are of: the run's steady step, else the profiled window's."""
    steady = ctx.result.run.steady_step_ms is not None
    return "step ms (steady)" if steady else "step ms (profiled window)"


def dataparallel(ctx: ViewContext) -> None:
    _view_header(ctx, "DataParallel")
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
        _step_label(ctx): shown_step,
        "projected DDP step ms": dp.projected_ddp_step_ms,
    }
    _metrics({k: v for k, v in facts.items() if v is not None})
    for f in ctx.result.findings:
        if f.kind in DP_FINDINGS:
            st.markdown(f"**{md(f.severity)}: {md(f.title)}**{report_overview.cost_suffix(f)}")
            st.markdown(f"Fix: {md(f.fix)}")
            with st.expander("Evidence"):
                _evidence(f)
    if dp.projection_assumptions:
        with st.expander("How the DDP projection is made"):
            for line in dp.projection_assumptions:
                st.markdown(f"- {md(line)}")
    stages = report_tables.dp_stage_frame(dp.stage_ms_per_step, dp.stage_events)
    _dataframe(stages)


# --------------------------------------------------------------------------- Compare


def compare_pair(refs: list[runs.RunRef], selected: runs.RunRef) -> tuple[int, int | None]:
    """Run A is the run selected in the sidebar; run B its partner: the first other run
    whose manifest records the same world size, backend, script and work arguments
    (:func:`comparable_recordings`), else none (the reader picks, and the page says why
    none was). Decided from the runs' own files, never from which runs happen to be
    analysed: the default changed with the analysis cache (probe N8)."""
    a = refs.index(selected)
    mine = recorded_shape(selected.path)
    for i, ref in enumerate(refs):
        if i != a and comparable_recordings(mine, recorded_shape(ref.path)):
            return a, i
    return a, None


NO_PARTNER = (
    "No comparable run (the same world size, backend, script and arguments, as the runs' "
    "manifests record them): pick Run B to compare anyway; the page then says what differs."
)


PARTNER = "partner"  # Run B's select, bound to ?partner= (a shared URL opens the comparison)
_PARTNER_OF = "partner_of"  # session state: the run A the partner was chosen for
_PARTNERS = "partners_chosen"  # session state: run A -> the partner last shown with it


def bad_url_value(key: str, value: str, among: str, shown: str) -> None:
    """The one-line notice for a URL value that names nothing (``?run=``, ``?view=``,
    ``?partner=``): what was asked, that it is not there, and what is shown instead."""
    st.error(md(f"{value}: no {key} of that name among {among} ({key}= in the URL); {shown}"))


def ambiguous_url_value(key: str, value: str, candidates: list[str], shown: str) -> None:
    """The one-line notice for a URL value that names several runs (``?run=collate1``
    with ``runs/collate1`` and ``runsB/collate1``): which ones, and what is shown."""
    named = ", ".join(candidates)
    st.error(
        md(
            f"{value}: ambiguous, {len(candidates)} runs have that name ({key}= in the "
            f"URL): {named}; {shown}"
        )
    )


def init_partner(ref: runs.RunRef, all_runs: list[runs.RunRef]) -> str | None:
    """Run B before its select is drawn: the URL's ?partner= when it names a run, else
    the one last shown with this run A, else :func:`compare_pair`'s choice. Kept while
    run A stays; a new run A (the sidebar) starts from its own. The app calls it before
    it writes the URL, so the run, the view and Run B reach the URL in one history entry
    (Back from Compare went to Compare without its Run B: probe D3)."""
    labels = [r.label for r in all_runs]
    a = ref.label
    state = st.session_state
    if state.get(_PARTNER_OF) == a and state.get(PARTNER) in labels:
        return str(state[PARTNER])
    chosen: dict[str, str] = state.setdefault(_PARTNERS, {})
    wanted = st.query_params.get(PARTNER) if _PARTNER_OF not in state else None
    if wanted and wanted not in labels and runs.find_run(all_runs, wanted) is not None:
        wanted = labels[runs.find_run(all_runs, wanted) or 0]  # a run's own folder name
    if wanted and wanted not in labels and runs.ambiguity(all_runs, wanted):
        shown = "Run B is chosen below"
        ambiguous_url_value(PARTNER, wanted, runs.ambiguity(all_runs, wanted), shown)
    elif wanted and wanted not in labels:
        bad_url_value(PARTNER, wanted, "the runs found", "Run B is chosen below")
    if wanted not in labels:
        wanted = chosen.get(a)
    if wanted not in labels:
        ib = compare_pair(all_runs, ref)[1]
        wanted = labels[ib] if ib is not None else None
    state[PARTNER] = wanted
    state[_PARTNER_OF] = a
    return wanted


def _partner_to_url(wanted: str | None) -> None:
    """Run B into the URL before its select is first drawn. Streamlit writes a bound
    select's value into the URL when it is clicked, or set in session state after it was
    drawn; a value set before the first draw (the default partner, Compare opened from a
    URL or another view) stayed out of it, so a shared link did not name Run B (probe
    31f, D10). Unbound until the select is drawn, ?partner= can be written here; the
    select then reads it from the URL. Once bound, Streamlit writes it itself."""
    if wanted is None or st.query_params.get(PARTNER) == wanted:
        return
    try:
        st.query_params[PARTNER] = wanted
    except StreamlitAPIException:  # bound: the select was drawn, Streamlit writes it
        pass


def _compare_runs(ctx: ViewContext, labels: list[str]) -> tuple[str | None, str | None]:
    """The Run A and Run B selects. Run A is the run shown (?run=): choosing another
    there shows it, as the sidebar does. Run B is bound to ?partner=, so reloading or
    sharing the URL opens the same comparison (browser probe of issue 31, C)."""
    a = ctx.ref.label
    _partner_to_url(init_partner(ctx.ref, ctx.all_runs))

    def follow_a() -> None:
        new = st.session_state.get(f"compare_a:{a}")
        if isinstance(new, str) and new != a:
            # The partner stays with the new run A only when comparable with it; else the
            # new run A gets its own (:func:`_init_partner`). Before, a 4-rank run kept
            # the 2-rank partner of the run before it (issue 31, F).
            partner = st.session_state.get(PARTNER)
            if partner in labels and comparable_recordings(_shape(new), _shape(partner)):
                st.session_state[_PARTNER_OF] = new
            ctx.select_run(new)

    def _shape(label: str) -> RecordedShape | None:
        return recorded_shape(ctx.all_runs[labels.index(label)].path)

    col_a, col_b = st.columns(2)
    name_a = col_a.selectbox(
        "Run A", labels, index=labels.index(a), key=f"compare_a:{a}", on_change=follow_a
    )
    name_b = col_b.selectbox(
        "Run B",
        labels,
        index=None,
        key=PARTNER,
        bind="query-params",
        placeholder="No comparable run: pick one",
    )
    if name_b is not None:
        st.session_state[_PARTNERS][a] = name_b
    else:
        st.caption(NO_PARTNER)
    return name_a, name_b


def compare(ctx: ViewContext) -> None:
    _view_header(ctx, "Compare", "Run A: ")
    if len(ctx.all_runs) < 2:
        st.info("Give the dashboard at least two runs to compare.")
        return
    labels = [r.label for r in ctx.all_runs]
    name_a, name_b = _compare_runs(ctx, labels)
    if name_a is None or name_b is None:
        return
    res_a, err_a = ctx.result_of(ctx.all_runs[labels.index(name_a)])
    res_b, err_b = ctx.result_of(ctx.all_runs[labels.index(name_b)])
    for err in (err_a, err_b):
        if err:
            st.error(md(err))
    if res_a is None or res_b is None:
        return
    comparison = compare_results(res_a, res_b)
    for line in comparison.warnings:
        st.warning(md(line))
    # the metrics under the names the Overview gives them, not the table's keys
    parts_named = report_overview.component_labels(comparison.has_gpu_trace)
    # exposed communication split as the Overview splits it (probe 31f, D2), as the CLI's
    split, headers = report_tables.compare_view(comparison, res_a, res_b)
    table = split.assign(metric=[headers.get(m, m) for m in split["metric"]])
    if table.dropna(subset=["a", "b"], how="all").empty:
        st.info("Neither run has per-rank step times to compare.")
    else:
        _chart(figures.compare_figure(table, name_a, name_b, list(split["metric"])))
        if "comm_exposed" in set(split["metric"]) and "comm_exposed" in res_a.ranks:
            st.caption(
                f"{md(parts_named['comm_exposed'].capitalize())} is not split into "
                f"{md(parts_named['comm_wait'])} and transfer here: one of the runs has a rank "
                "whose wait could not be measured (as its Overview says)."
            )
        most = [rank_means.most_change_text(row) for row in table.to_dict(orient="records")]
        shown = table[["metric", "a", "b", "delta", "delta_pct"]].rename(
            columns={
                "a": f"A: {name_a} (ms/step)",
                "b": f"B: {name_b} (ms/step)",
                "delta": "B − A ms/step",
                "delta_pct": "B − A %",
            }
        )
        shown[rank_means.MOST_HEADER] = most
        _dataframe(shown, {"B − A %": numbers.PCT_DIGITS})
        st.caption(md(rank_means.compare_means_text()))
    moved = report_tables.moved_components_text(comparison.changed_components(), split, headers)
    if moved:
        st.write(md(moved))
    st.subheader("Findings that appeared, went or changed")
    if comparison.finding_changes:
        _table(report_tables.finding_changes_frame(comparison.finding_changes))
        st.caption(md(report_tables.FINDING_COSTS_TEXT))
    else:
        st.write("The same findings at the same severity in both runs.")
    if _has_rows(res_a.ranks) and _has_rows(res_b.ranks):
        st.subheader("Per rank (ms per step, mean over each run's analysed steps)")
        pair = report_tables.per_rank_pair(res_a, res_b)
        _chart(
            figures.stacked_columns_figure(
                pair.assign(rank=[f"rank {int(r)}" for r in pair["rank"]]),
                "rank",
                [c for c in pair.columns if c.endswith("step ms (mean)")],
                "Step time per rank, A and B (ms)",
                barmode="group",
                colors=list(colours.RUN_COLORS),
            )
        )
        _dataframe(pair, {"rank": 0})


# --------------------------------------------------------------------------- Code


def lint_rows(lint: LintReport | None) -> list[LintDiagnostic]:
    """The diagnostics of a run's lint.json."""
    return list(lint.diagnostics) if lint is not None else []


def lint_table(items: list[LintDiagnostic], findings: list[Finding]) -> pd.DataFrame:
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
                "runtime cost ms/step": (float(runtime.cost_ms_per_step) if runtime else None),
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
    _view_header(ctx, "Code")
    lint = ctx.result.lint
    script = _script_of(ctx.result)
    if lint is None and script is not None:
        st.info(f"No lint.json in this run; the traced script is {md(script)}.")
        if st.button(f"Lint {md(script.name)} now (static analysis, nothing is run)"):
            from gpudiag.lint import lint_paths
            from gpudiag.lint.report import parse_lint

            lint = parse_lint(lint_paths([script]).to_json(), str(script))
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
        _dataframe(
            table[["code", "rule", "severity", "location", "measured as", "runtime cost ms/step"]]
        )
        for item, row in zip(items, table.itertuples(index=False), strict=True):
            cost = row[-1]
            measured = (
                f" — measured: {numbers.ms(cost, 'ms/step')} ({md(row[6])})"
                if pd.notna(cost)
                else ""
            )
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
            st.markdown(f"{md(f.location)} — {md(f.title)}{report_overview.cost_suffix(f)}")


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
