"""The Streamlit dashboard on real runs: a 2-rank gloo DDP run recorded here with
`gpudiag trace` (once per session), the same run without profiling, a broken copy of
it, and the real GPU traces in ../shared/traces. Every view is driven with Streamlit's
AppTest and its numbers are checked against `gpudiag.analysis.analyze` directly; the
browser tests drive the real CLI in headless Chromium.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ and tests/browser/ are not installed packages

from dashboards import runs as dash_runs  # noqa: E402
from dashboards import views  # noqa: E402
from dashboards.views import md  # noqa: E402
from gpudiag.analysis.compare import shape_warnings  # noqa: E402
from gpudiag.cli import dashboard as dashboard_cli  # noqa: E402
from gpudiag.report import figures, numbers  # noqa: E402
from gpudiag.report import overview as report_overview  # noqa: E402
from tests.browser.dashboard import free_port  # noqa: E402
from tests.dashboard_shown import table_with, url_errors  # noqa: E402

APP = REPO / "dashboards" / "app.py"
SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
ARTIFACTS = REPO / "tests" / "_artifacts"
SAMPLE_RUNS = REPO / "sample_runs"
RENDER_FAILED = "could not render"
VIEWS = list(views.VIEWS)


DP_CPU_SCRIPT = """
import torch
from torch import nn

model = nn.DataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = nn.functional.mse_loss(model(torch.randn(32, 64)), torch.randn(32, 8))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _record(out: Path, *extra: str, script: Path = SCRIPT, ranks: int = 2) -> None:
    script_args = ["--steps", "8"] if script == SCRIPT else []
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", str(ranks),
        "--master-port", str(free_port()), "--out", str(out), *extra,
        str(script), *script_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/ddp (profiled), runs/ddp_noprofile, runs/dp_cpu (nn.DataParallel on CPU, one
    process), runs/broken (a damaged copy of ddp), runs/unreadable (a trace that is not JSON)."""
    root = tmp_path_factory.mktemp("runs")
    _record(root / "ddp", "--profile-steps", "3-6")
    _record(root / "ddp_noprofile", "--no-profile", "--no-lint")
    dp_script = tmp_path_factory.mktemp("scripts") / "dp_cpu.py"
    dp_script.write_text(DP_CPU_SCRIPT)
    _record(root / "dp_cpu", "--profile-steps", "3-6", script=dp_script, ranks=1)
    broken = root / "broken"
    shutil.copytree(root / "ddp", broken)
    (broken / "manifest.json").write_text("{not json")
    trace = broken / "traces" / "rank1.pt.trace.json.gz"
    trace.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    with open(broken / "rank0" / "steps.jsonl", "a") as fh:
        fh.write('{"step": 99, "start_ns": 12')
    unreadable = root / "unreadable"
    unreadable.mkdir()
    (unreadable / "rank0.pt.trace.json").write_text("this is not a trace")
    return root


@pytest.fixture(scope="session")
def analyzed(runs_root: Path, shared_traces: Path) -> dict[str, object]:
    from gpudiag.analysis import analyze

    return {
        "ddp": analyze(runs_root / "ddp"),
        "ddp_noprofile": analyze(runs_root / "ddp_noprofile"),
        "dp_cpu": analyze(runs_root / "dp_cpu"),
        "dlrm8": analyze(shared_traces / "param_dlrm_ddp8"),
    }


def _app(monkeypatch: pytest.MonkeyPatch, roots: list[Path], run: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *map(str, roots)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    if run is not None:
        at.sidebar.selectbox(key="run").set_value(run).run()
    return at


def _view(at: AppTest, name: str) -> AppTest:
    at.sidebar.radio(key="view").set_value(name).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if RENDER_FAILED in e.value]
    return at


def _specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _values(data: object) -> list:
    """A plotly array: a list, or plotly's binary form {"bdata": base64, "dtype": ...}."""
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(data)  # type: ignore[arg-type]


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


# --------------------------------------------------------------------------- run roots


def test_runs_are_discovered_and_paths_confined(runs_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "traces").mkdir(parents=True)
    (outside / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"x")
    (runs_root / "escape").symlink_to(outside, target_is_directory=True)
    (runs_root / "ddp" / "traces" / "rank9.pt.trace.json.gz").symlink_to(
        outside / "traces" / "rank0.pt.trace.json.gz"
    )
    try:
        refs = dash_runs.discover_runs([runs_root])
        labels = {r.label.split("/")[-1] for r in refs}
        assert {"ddp", "ddp_noprofile", "dp_cpu", "broken", "unreadable"} <= labels
        assert "escape" not in labels  # resolves outside the root
        with pytest.raises(dash_runs.PathOutsideRoots):
            dash_runs.confine(runs_root / "ddp" / ".." / ".." / "..", [runs_root])
        with pytest.raises(dash_runs.PathOutsideRoots):
            dash_runs.confine("/etc/passwd", [runs_root])
        files = dash_runs.trace_files(runs_root / "ddp", [runs_root])
        assert set(files) == {"rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"}
        key = dash_runs.fingerprint(runs_root / "ddp")
        assert key == dash_runs.fingerprint(runs_root / "ddp")
    finally:
        (runs_root / "escape").unlink()
        (runs_root / "ddp" / "traces" / "rank9.pt.trace.json.gz").unlink()
    assert dash_runs.fingerprint(runs_root / "ddp") != key  # content changed -> new key


def _url_errors(**params: str) -> list[str]:
    """The app opened with these URL query parameters: its error lines as plain text
    (it must raise nothing)."""
    return url_errors(APP, **params)


def test_query_param_outside_roots_is_refused(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path
) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", str(runs_root)])
    assert any("outside the run roots" in e for e in _url_errors(run="/etc"))
    # a mistyped run name is no path leaving the roots: said as what it is (fourth probe)
    errors = _url_errors(run="runs/no_such_run")
    assert any("no run of that name among the runs found (run= in the URL)" in e for e in errors), (
        errors
    )
    assert not any("outside the run roots" in e for e in errors)


def test_bad_view_and_partner_in_the_url_get_the_run_notice(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path
) -> None:
    """?view= and ?partner= naming nothing get the one-line notice ?run= gets (probe 31, H)."""
    monkeypatch.setattr(sys, "argv", ["app.py", str(runs_root)])
    errors = _url_errors(view="Nope")
    assert any(
        e.startswith("Nope: no view of that name among the dashboard's views (view= in the URL)")
        for e in errors
    ), errors
    errors = _url_errors(view="Compare", partner="nope")
    assert any(
        e.startswith("nope: no partner of that name among the runs found (partner= in the URL)")
        for e in errors
    ), errors


# --------------------------------------------------------------------------- views


def test_every_view_renders_every_run(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, shared_traces: Path
) -> None:
    samples = [SAMPLE_RUNS] if dash_runs.discover_runs([SAMPLE_RUNS]) else []
    at = _app(monkeypatch, [runs_root, shared_traces, *samples])
    options = at.sidebar.selectbox(key="run").options
    assert len(options) >= 5 + 6 + len(dash_runs.discover_runs(samples))
    for run in options:
        at.sidebar.selectbox(key="run").set_value(run).run()
        for name in VIEWS:
            _view(at, name)
            if "unreadable" in run:
                assert any("cannot be analysed" in e.value for e in at.error), run
            else:
                assert at.header[0].value.startswith(name), (run, name)


def test_overview_shows_the_analysis_numbers(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, shared_traces: Path, analyzed: dict
) -> None:
    at = _app(monkeypatch, [runs_root, shared_traces], run="traces/param_dlrm_ddp8")
    result = analyzed["dlrm8"]
    facts = at.caption[0].value.replace("\\", "")
    assert facts.startswith("8 ranks · nccl · Tesla V100-SXM2-32GB · ")
    assert f"{result.run.steps_analysed} profiled step" in facts
    # issue 31 probe (D8): the page says the colours are shared across its charts
    assert report_overview.SHARED_COLOURS_NOTE in [c.value for c in at.caption]
    # Findings: a static table (long titles and fixes wrap, nothing cut off), in the
    # reports' one order (failures, then severity, then cost: as terminal and HTML).
    findings = at.table[0].value
    ordered = report_overview.ordered_findings(result.findings)
    assert len(result.findings) >= 2
    assert list(findings.columns) == ["severity", "cost ms/step", "kind", "ranks", "title", "fix"]
    assert list(findings["kind"]) == [md(f.kind) for f in ordered]
    assert list(findings["fix"]) == [md(f.fix) for f in ordered]
    assert [float(c.replace("\\", "")) for c in findings["cost ms/step"]] == pytest.approx(
        [round(f.cost_ms_per_step, 2) for f in ordered]
    )
    # What if: the same projections as `gpudiag whatif` and the JSON, after the findings
    assert result.whatif
    whatif = at.table[1].value
    assert list(whatif["fix"]) == [md(p.scenario) for p in result.whatif]
    assert [float(v.replace("\\", "")) for v in whatif["saving ms"]] == pytest.approx(
        [round(p.saving_ms, 2) for p in result.whatif]
    )
    per_rank = table_with(at, "compute ms/step")
    assert list(per_rank.columns) == list(report_overview.rank_table(result).columns)
    assert per_rank["compute ms/step"].tolist() == pytest.approx(
        result.ranks["compute"].tolist(),
        abs=0.0051,  # as shown: two decimals
    )
    # the first chart: an inline SVG of the same numbers (no chart script to load)
    svg = next(m.value for m in at.markdown if "gpudiag-rank-parts" in m.value)
    drawn = [
        float(v)
        for v in re.findall(r'data-component="compute" data-rank="\d+" data-ms="([0-9.]+)"', svg)
    ]
    assert drawn == pytest.approx(result.ranks["compute"].tolist(), abs=1e-3)
    label = at.download_button[0].label
    assert label.startswith("Download " + md("worker0_step_12")) and "KiB)" in label
    assert any("tensorboard --logdir" in t.value for t in at.text)


def test_timeline_draws_the_analysis_intervals(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, shared_traces: Path, analyzed: dict
) -> None:
    at = _view(_app(monkeypatch, [shared_traces], run="traces/param_dlrm_ddp8"), "Timeline")
    expected = analyzed["dlrm8"].timeline(None, max_intervals=5000)
    spec = _specs(at)[0]
    lines = [t for t in spec["data"] if t["mode"] == "lines"]
    drawn = sum(sum(1 for x in _values(t["x"]) if x is not None) // 2 for t in lines)
    steps = expected[expected["lane"] == "step"]
    assert drawn == len(expected) - len(steps) > 100  # steps are shaded bands, not lines
    shaded = [s for s in spec["layout"].get("shapes", []) if s.get("type") == "rect"]
    assert len(shaded) == (steps["rank"] == steps["rank"].min()).sum() >= 1
    ticks = spec["layout"]["yaxis"]["ticktext"]
    assert "rank 7 · communication" in ticks and f"rank 0 · {report_overview.GPU_COMPUTE}" in ticks
    # the lanes are named as the Overview's chart names the components (fourth probe)
    assert not any(t.endswith((" · other", " · idle", " · data_loading")) for t in ticks)
    assert {t["type"] for t in spec["data"]} == {"scatter"}
    # A smaller budget gives fewer (merged) intervals, never more than asked.
    at.select_slider[0].set_value(1000).run()
    lines = [t for t in _specs(at)[0]["data"] if t["mode"] == "lines"]
    assert sum(sum(1 for x in _values(t["x"]) if x is not None) // 2 for t in lines) <= 1000
    # Ranks picked keep their places relative to each other: drawn as the analysis
    # draws them together (one time origin), not each from its own first interval.
    at.select_slider[0].set_value(5000).run()
    at.multiselect[0].set_value([1, 3]).run()
    want = figures.timeline_figure(analyzed["dlrm8"].timeline(max_intervals=5000, ranks=(1, 3)))
    got = [t for t in _specs(at)[0]["data"] if t["mode"] == "lines"]
    starts = [t for t in want.data if t.mode == "lines"]
    assert len(got) == len(starts) > 0
    for drawn_lane, want_lane in zip(got, starts, strict=True):
        assert _values(drawn_lane["x"]) == pytest.approx(list(want_lane.x), nan_ok=True)


def test_step_breakdown_and_communication_numbers(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, analyzed: dict
) -> None:
    at = _app(monkeypatch, [runs_root], run=_label(runs_root, "ddp"))
    result = analyzed["ddp"]
    _view(at, "Step breakdown")
    bars = {t["name"]: t["y"] for t in _specs(at)[0]["data"]}
    bd = result.breakdown.sort_values(["rank", "step"])
    # the Overview's names for this run: its wait is named for the late rank, and says
    # "or in sync points" when the run has one (a recorded run may or may not)
    names = report_overview.run_labels(result)
    if names["comm_wait"] in bars:  # split as the Overview splits it (probe 31f, D2)
        exposed = np.add(_values(bars[names["comm_wait"]]), _values(bars[names["comm_transfer"]]))
    else:
        exposed = _values(bars[names["comm_exposed"]])
    assert list(exposed) == pytest.approx(bd["comm_exposed"].tolist())
    assert _values(bars[names["compute"]]) == pytest.approx(bd["compute"].tolist())
    assert _values(bars[names["other"]]) == pytest.approx(bd["other"].tolist())
    # Data loading as tables of the typed result, not a raw JSON blob.
    assert not at.json
    every_step = next(
        d.value
        for d in at.dataframe
        if "step ms (mean over every recorded step)" in d.value.columns
    )
    expected = [result.dataloader.run[r].data_ms_per_step for r in sorted(result.dataloader.run)]
    assert every_step["data wait ms/step"].tolist() == pytest.approx(expected)
    _view(at, "Communication")
    summary = result.collective_summary
    assert len(summary) > 0
    # DDP buckets: sizes in MiB, times in ms, no raw nanosecond timestamps.
    buckets = next(d.value for d in at.dataframe if "bucket (issue order)" in d.value.columns)
    assert not [c for c in buckets.columns if "_" in str(c)]
    assert "size MiB" in buckets.columns and "bytes" not in buckets.columns
    assert len(buckets) == len(result.buckets)
    # No link peak on a CPU run: no bandwidth chart, the numbers in the table (units in
    # every header); the arrival skew heatmap is the first chart.
    assert summary["peak_gbs"].isna().all()
    assert not [t for s in _specs(at) for t in s["data"] if t.get("name") == "busbw median"]
    table = next(d.value for d in at.dataframe if "busbw GB/s (median)" in d.value.columns)
    assert table["busbw GB/s (median)"].tolist() == pytest.approx(
        summary["busbw_gbs_median"].tolist(), nan_ok=True
    )
    assert "MiB (median per call)" in table.columns
    if len(result.skew):
        heat = _specs(at)[0]
        assert heat["data"][0]["type"] == "heatmap"
        assert heat["data"][0]["y"] == ["rank 0", "rank 1"]


def _label(root: Path, name: str) -> str:
    return f"{root.name}/{name}"


def test_host_metrics_code_and_compare(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, analyzed: dict
) -> None:
    at = _app(monkeypatch, [runs_root], run=_label(runs_root, "ddp"))
    result = analyzed["ddp"]
    _view(at, "GPU metrics")
    host = result.host_samples
    assert len(host) > 0
    cpu = next(s for s in _specs(at) if s["layout"]["title"]["text"].startswith("host CPU busy"))
    assert _values(cpu["data"][0]["y"]) == pytest.approx(
        host.sort_values("t_ns")["cpu_percent"].tolist(), nan_ok=True
    )
    # Memory in GiB or MiB, never plotly's SI "1.6B" for bytes.
    rss = next(
        s
        for s in _specs(at)
        if s["layout"]["title"]["text"].startswith("training processes' resident memory")
    )
    unit = rss["layout"]["yaxis"]["title"]["text"]
    assert unit in ("GiB", "MiB"), unit
    scale = 2**30 if unit == "GiB" else 2**20
    assert _values(rss["data"][0]["y"]) == pytest.approx(
        (host.sort_values("t_ns")["proc_rss"] / scale).tolist(), nan_ok=True
    )

    _view(at, "Code")
    lint = at.dataframe[0].value
    expected = result.lint.diagnostics
    assert lint["code"].tolist() == [f.code for f in expected]
    assert lint["location"].tolist() == [f"{f.path}:{f.line}" for f in expected]

    _view(at, "Compare")
    # Run A is the run selected in the sidebar; B a run of the same shape (2 gloo ranks,
    # already analysed, every rank analysed) or none, never the 1-process DataParallel
    # run, nor `broken`, which lost rank 1's trace (a mean over 1 rank against one over 2)
    ddp, dp_cpu = _label(runs_root, "ddp"), _label(runs_root, "dp_cpu")
    assert at.selectbox(key=f"compare_a:{ddp}").value == ddp
    assert at.selectbox(key="partner").value in {_label(runs_root, "ddp_noprofile"), None}
    # ?view= is bound to the view radio: the browser writes it (tests/test_dashboard_live.py
    # checks the URL in Chromium); AppTest has no browser, so the radio's state is read
    assert at.session_state["view"] == "Compare" and at.query_params["run"] == ddp
    # DP vs DDP picked by hand: another shape, said so; what changed, per rank too
    at.selectbox(key="partner").set_value(dp_cpu).run()
    assert any(
        "World size differs: A 2 ranks, B 1" in w.value.replace("\\", "") for w in at.warning
    )
    changes = next(t.value for t in at.table if "change" in t.value.columns)
    assert len(changes) >= 1
    per_rank = next(d.value for d in at.dataframe if "A step ms (mean)" in d.value.columns)
    assert per_rank["A step ms (mean)"].tolist() == pytest.approx(
        result.ranks["step_ms_mean"].tolist()
    )
    at.sidebar.selectbox(key="run").set_value(dp_cpu).run()
    assert at.selectbox(key=f"compare_a:{dp_cpu}").value == dp_cpu
    assert at.selectbox(key="partner").value is None  # no other 1-rank run
    assert at.query_params["run"] == dp_cpu
    at.sidebar.selectbox(key="run").set_value(ddp).run()
    at.selectbox(key="partner").set_value(_label(runs_root, "ddp_noprofile")).run()
    from gpudiag.analysis.compare import compare

    table = compare(result, analyzed["ddp_noprofile"]).table
    shown = at.dataframe[0].value
    # the Overview's names for the metrics (the browser probe read raw keys)
    assert shown["metric"].tolist() == [
        report_overview.rank_headers(result).get(m, m) for m in table["metric"]
    ]
    assert shown["B − A ms/step"].tolist() == pytest.approx(table["delta"].tolist(), nan_ok=True)


def test_dataparallel_view_on_a_real_cpu_dataparallel_run(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, analyzed: dict
) -> None:
    at = _view(_app(monkeypatch, [runs_root], run=_label(runs_root, "dp_cpu")), "DataParallel")
    dp = analyzed["dp_cpu"].dataparallel
    assert dp is not None and dp.on_cpu
    assert any("DataParallel ran on CPU" in w.value for w in at.warning)
    # metrics through the one formatter (two decimals), as every table
    assert _metric(at, "forward ms/step") == md(numbers.num(dp.forward_ms_per_step))
    assert _metric(at, "step ms (steady)") == md(numbers.num(analyzed["dp_cpu"].step_ms))
    stages = next(t for t in _specs(at)[0]["data"] if t["type"] == "bar")
    assert list(stages["x"]) == list(dp.stage_ms_per_step)
    on_cpu = next(f for f in analyzed["dp_cpu"].findings if f.kind == "dp_on_cpu")
    assert any(md(on_cpu.title) in m.value for m in at.markdown)
    assert not at.json or all("detected" not in j.value for j in at.json)  # no raw dump
    # The DDP run is not DataParallel: the view says so, says that there is no model of
    # DP's cost to project from it, and how to record one, instead of drawing zeros.
    at.sidebar.selectbox(key="run").set_value(_label(runs_root, "ddp")).run()
    assert any("does not use `torch.nn.DataParallel`" in i.value for i in at.info)
    assert any("no model that predicts" in m.value for m in at.markdown)
    assert any("gpudiag trace --nproc-per-node 1" in c.value for c in at.code)


def test_run_without_traces_shows_its_step_table(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path, analyzed: dict
) -> None:
    at = _app(monkeypatch, [runs_root], run=_label(runs_root, "ddp_noprofile"))
    result = analyzed["ddp_noprofile"]
    steps = result.run.steps_analysed
    assert steps >= 8 and f"· {steps} recorded steps ·" in at.caption[0].value.replace("\\", "")
    assert any("no profiler traces" in m.value for m in at.markdown)
    _view(at, "Timeline")
    assert at.info or at.get("plotly_chart")


def test_broken_run_shows_what_it_can(monkeypatch: pytest.MonkeyPatch, runs_root: Path) -> None:
    at = _app(monkeypatch, [runs_root], run=_label(runs_root, "broken"))
    assert not at.exception
    assert any("reading this run" in w.value for w in at.warning)
    details = "\n".join(t.value for t in at.text)
    assert "manifest.json" in details and "rank1.pt.trace.json.gz" in details
    assert at.caption[0].value.startswith("2 ranks")  # rank 0's trace is intact
    at.sidebar.selectbox(key="run").set_value(_label(runs_root, "unreadable")).run()
    assert any("cannot be analysed" in e.value and "unreadable" in e.value for e in at.error)
    assert not at.exception


def test_bad_run_parameter_is_one_line(monkeypatch: pytest.MonkeyPatch, runs_root: Path) -> None:
    """`/?run=%00` and friends: one line saying what is wrong, never a traceback."""
    for bad in ("\x00", "x" * 5000, "../../../etc/passwd", "%00"):
        monkeypatch.setattr(sys, "argv", ["app.py", str(runs_root)])
        at = AppTest.from_file(str(APP), default_timeout=180)
        at.query_params["run"] = bad
        at.run()
        assert not at.exception, bad
        errors = [e.value for e in at.error if "Fix:" not in e.value]  # not the verdict
        assert len(errors) == 1 and "\n" not in errors[0], (bad, errors)
        assert "Traceback" not in errors[0] and "File " not in errors[0]
        assert at.header[0].value.startswith("Overview")  # the first run is shown instead


def test_clients_cannot_clear_the_analysis_cache(
    monkeypatch: pytest.MonkeyPatch, runs_root: Path
) -> None:
    """Streamlit's clear_cache message (any web client can send it) clears every
    st.cache_* cache and the session state; the analyses survive it."""
    from types import SimpleNamespace

    from streamlit.runtime.app_session import AppSession
    from streamlit.runtime.state import SessionState

    from dashboards import cache

    at = _app(monkeypatch, [runs_root], run=_label(runs_root, "ddp"))
    ref = next(r for r in dash_runs.discover_runs([runs_root]) if r.path.name == "ddp")
    key = cache.key_of(ref)
    assert cache.ANALYSES.peek(key) is not None
    computed = cache.ANALYSES.computed
    # The handler AppSession.handle_backmsg runs for a client's clear_cache message.
    AppSession._handle_clear_cache_request(SimpleNamespace(_session_state=SessionState()))  # type: ignore[arg-type]
    assert cache.ANALYSES.peek(key) is not None
    at.run()
    _view(at, "Timeline")
    assert cache.ANALYSES.computed == computed  # nothing analysed again


# --------------------------------------------------------------------------- CLI


def test_cli_command_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cmd = dashboard_cli.streamlit_command([tmp_path], "127.0.0.1", 8600)
    joined = " ".join(cmd)
    assert "--server.address 127.0.0.1" in joined and "--server.port 8600" in joined
    assert "--browser.gatherUsageStats false" in joined
    assert "--server.fileWatcherType none" in joined
    assert cmd[-2:] == ["--", str(tmp_path.resolve())]
    assert dashboard_cli.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "missing: not a directory" in err and "Traceback" not in err
    assert dashboard_cli._parser().parse_args([]).host == "127.0.0.1"


def test_cli_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "dashboard", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no URL printed for a server that never started
    assert proc.stderr.count("\n") == 1 and f"port {port}" in proc.stderr
    assert "already in use" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_default_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert tmp_path / "gpudiag_runs" not in dashboard_cli.default_runs()
    (tmp_path / "gpudiag_runs").mkdir()
    defaults = dashboard_cli.default_runs()
    assert tmp_path / "gpudiag_runs" in defaults
    assert all(p.is_dir() for p in defaults)
    assert (REPO / "sample_runs" in defaults) == SAMPLE_RUNS.is_dir()


# --------------------------------------------------------------------------- browser


@pytest.mark.browser
def test_browser_every_view_and_ctrl_c(runs_root: Path, shared_traces: Path) -> None:
    from tests.browser import dashboard as browser

    ARTIFACTS.mkdir(exist_ok=True)
    server = browser.Dashboard([runs_root, shared_traces])
    try:
        server.wait_ready()
        with browser.browser() as page:
            for run, visit, charted in (
                # Compare: no run of the 8-rank set's shape here, so no default pairing
                # and no chart (issue 31: never pair a run of another shape by default)
                ("traces/param_dlrm_ddp8", VIEWS, set(VIEWS) - {"DataParallel", "Code", "Compare"}),
                (_label(runs_root, "ddp"), ["Timeline", "GPU metrics", "Code"], {"Timeline"}),
                (_label(runs_root, "dp_cpu"), ["DataParallel"], {"DataParallel"}),
            ):
                page.goto(browser.view_url(server.url, run, "Overview"))
                browser.wait_idle(page)
                for name in visit:
                    browser.open_view(page, name)
                    if name in charted:  # the Overview's chart is an inline SVG
                        page.wait_for_selector(browser.FIRST_CHART, timeout=60_000)
                    slug = f"{run.split('/')[-1]}_{name.replace(' ', '_').lower()}"
                    page.screenshot(path=str(ARTIFACTS / f"dashboard_{slug}.png"), full_page=True)
                    assert page.locator(browser.EXCEPTION).count() == 0, (run, name)
                    assert RENDER_FAILED not in page.inner_text("body"), (run, name)
        assert "gpudiag dashboard: http://127.0.0.1:" in server.log()
    finally:
        code = server.interrupt()
        log = server.log()
        server.close()
    assert code == 130, log
    with pytest.raises(ConnectionRefusedError):  # streamlit stopped with the CLI
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def _evil_run(src: Path, dest: Path, evil: str) -> None:
    """A copy of a recorded run whose run-derived text is Markdown: the trace's device
    name, rank_info's device, and the lint fields (message, why, fix with backticks)."""
    import gzip

    shutil.copytree(src, dest)
    trace = dest / "traces" / "rank0.pt.trace.json.gz"
    data = json.loads(gzip.decompress(trace.read_bytes()))
    data["deviceProperties"] = [{"id": 0, "name": evil, "totalGlobalMem": 0}]
    trace.write_bytes(gzip.compress(json.dumps(data).encode()))
    info_path = dest / "rank1" / "rank_info.json"
    info = json.loads(info_path.read_text())
    info["device"] = f"{evil} rank_info"
    info_path.write_text(json.dumps(info))
    lint = json.loads((dest / "lint.json").read_text())
    assert lint["findings"]
    for item in lint["findings"]:
        item["message"], item["why"] = f"{evil} message", f"{evil} why"
        item["fix"] += f" `code` {evil} fix"
    (dest / "lint.json").write_text(json.dumps(lint))


LOADED_MACHINE_MS = 240_000  # a first page took 81 s with 20 processes on 2 cores


@pytest.mark.browser
def test_browser_run_text_is_never_markup(runs_root: Path, tmp_path: Path) -> None:
    """A trace whose device name is `![t](http://HOST/x.png)` (and a run folder named
    like one): the reviewer's browser fetches nothing from HOST and shows the text."""
    import http.server
    import threading

    from tests.browser import dashboard as browser

    hits: list[str] = []

    class Host(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Host)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    evil = f"![t](http://127.0.0.1:{host.server_address[1]}/x.png)"
    root = tmp_path / "evil_root"
    root.mkdir()
    run_name = "run ![r](x.png) `code` $x$"
    _evil_run(runs_root / "ddp", root / run_name, evil)
    label = f"evil_root/{run_name}"
    server = browser.Dashboard([root])
    requests: list[str] = []
    try:
        server.wait_ready()
        with browser.browser() as page:
            page.on("request", lambda r: requests.append(r.url))
            page.goto(browser.view_url(server.url, label, "Overview"))
            browser.wait_idle(page, LOADED_MACHINE_MS)
            page.wait_for_selector(browser.FIRST_CHART, timeout=LOADED_MACHINE_MS)
            body = page.inner_text("body")
            assert f" · {evil}, " in body and f", {evil} rank_info" in body  # the run's facts
            assert f"Overview · {label}" in body
            page.screenshot(path=str(tmp_path / "evil_overview.png"), full_page=True)
            browser.open_view(page, "Code", LOADED_MACHINE_MS)
            body = page.inner_text("body")
            assert f"{evil} message" in body and f"{evil} why" in body
            assert f"`code` {evil} fix" in body  # backticks shown, not code markup
            page.screenshot(path=str(tmp_path / "evil_code.png"), full_page=True)
            assert page.locator(browser.EXCEPTION).count() == 0
            assert page.locator("img[src*='x.png']").count() == 0
    finally:
        server.close()
        host.shutdown()
    assert not hits, hits
    fetched = [u for u in requests if urllib.parse.urlsplit(u).path.endswith("x.png")]
    assert not fetched, fetched  # (the page's own URL names the run, x.png included)


def test_script_activity_and_quiet_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from dashboards import cache, serve

    activity = cache.ScriptActivity()
    assert activity.quiet_for() == 0.0 and not activity.ever_ran()
    activity.started()
    assert activity.quiet_for() == 0.0 and activity.ever_ran()  # running: never quiet
    activity.finished()
    time.sleep(0.05)
    assert activity.quiet_for() >= 0.05
    monkeypatch.setattr(serve, "QUIET_S", 0.05)
    t0 = time.monotonic()
    serve._wait_until_quiet(activity)  # quiet already
    assert time.monotonic() - t0 < 0.5
    # no browser ever came: the other runs are analysed once UNATTENDED_S has passed
    monkeypatch.setattr(serve, "QUIET_S", 60.0)
    monkeypatch.setattr(serve, "UNATTENDED_S", 0.0)
    t0 = time.monotonic()
    serve._wait_until_quiet(cache.ScriptActivity())
    assert time.monotonic() - t0 < 0.5


def test_compare_pairs_a_run_only_with_a_comparable_one(tmp_path: Path) -> None:
    """Issue 31, the independent browser probe: Compare paired a 2-rank run with the
    bench's batch-128 run (another script and batch, which the page itself then warned
    about). The default partner is a run of the same shape and the same script and
    arguments, else none: read from the runs' manifests, nothing analysed (probe N8)."""
    from gpudiag.analysis import analyze

    roots = [tmp_path / "runs"]
    for name in ("ddp2_healthy", "ddp2_dataloader_bound"):
        shutil.copytree(SAMPLE_RUNS / name, roots[0] / name)
    shutil.copytree(SAMPLE_RUNS / "bench_cpu" / "ddp-bs128", roots[0] / "bs128")
    refs = dash_runs.discover_runs(roots)
    healthy = next(r for r in refs if r.path.name == "ddp2_healthy")
    assert views.compare_pair(refs, healthy)[1] is None  # none is comparable
    shutil.copytree(SAMPLE_RUNS / "ddp2_healthy", roots[0] / "healthy_again")
    refs = dash_runs.discover_runs(roots)
    healthy = next(r for r in refs if r.path.name == "ddp2_healthy")
    _, b = views.compare_pair(refs, healthy)
    assert b is not None and refs[b].path.name == "healthy_again"
    # the manifests' answer is the analyses' answer
    assert shape_warnings(analyze(healthy.path), analyze(refs[b].path)) == []


@pytest.mark.parametrize(
    ("host", "words"),
    [("no.such.host.invalid", "cannot resolve it"), ("10.99.99.99", "cannot listen there")],
)
def test_cli_a_host_it_cannot_listen_on_is_said_so(tmp_path: Path, host: str, words: str) -> None:
    """A bad --host read "port 8700 on no.such.host is already in use" (probe 31i N2)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "dashboard", str(tmp_path), "--host", host,
         "--port", "8700"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"--host {host}: {words}" in proc.stderr
    assert "already in use" not in proc.stderr


def test_a_run_has_one_name_however_the_dashboard_was_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probe 31k, N3: `gpudiag dashboard runs` named a run "runs/live1", `gpudiag dashboard
    runs/live1 ...` named it "live1", so a shared ``?run=`` from one gave the other a red
    "no run of that name". Started on the folder or on its run directories, each run of
    sample_runs/ has the same name, that name opens it, and so does its own folder name
    (a link made before)."""
    samples = REPO / "sample_runs"
    names = ("ddp4_straggler", "ddp2_healthy")
    by_folder = {r.path: r.label for r in dash_runs.discover_runs([samples])}
    by_runs = {r.path: r.label for r in dash_runs.discover_runs([samples / n for n in names])}
    assert by_runs == {p: by_folder[p] for p in by_runs}, (by_runs, by_folder)
    assert set(by_runs.values()) == {f"sample_runs/{n}" for n in names}
    for roots in ([samples], [samples / n for n in names]):
        monkeypatch.setattr(sys, "argv", ["app.py", *map(str, roots)])
        for wanted in ("sample_runs/ddp2_healthy", "ddp2_healthy"):
            at = AppTest.from_file(str(APP), default_timeout=180)
            at.query_params["run"] = wanted
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            assert not [e.value for e in at.error if "no run of that name" in e.value], wanted
            assert at.sidebar.selectbox(key="run").value == "sample_runs/ddp2_healthy"
