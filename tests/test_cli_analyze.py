"""`gpudiag analyze` / `gpudiag compare` as a user runs them, on the real traces in
../shared/traces: JSON schema, standalone HTML, --fail-on exit codes, bad input,
import hygiene (no torch, rich or plotly for --json)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpudiag.cli import main
from gpudiag.paths import sample_runs_dir

BREAKDOWN_KEYS = {"compute", "comm_overlapped", "comm_exposed", "data_loading", "idle", "other"}
FINDING_KEYS = {
    "kind",
    "severity",
    "cost_ms_per_step",
    "ranks",
    "title",
    "evidence",
    "fix",
    "location",
}


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def gpudiag(capsys: pytest.CaptureFixture[str]):
    """`gpudiag ARGS...` through the real entry point, in-process (no interpreter start
    per call); the import-hygiene test below runs a fresh interpreter."""

    def run(*args: str) -> Ran:
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def test_json_schema(shared_traces, gpudiag):
    proc = gpudiag("analyze", "--json", str(shared_traces / "param_dlrm_ddp8"))
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["schema_version"] == 1
    assert {"run", "ranks", "collectives", "findings", "warnings", "stragglers"} <= set(d)
    run = d["run"]
    assert run["world_size"] == 8 and run["backend"] == "nccl"
    assert run["devices"] == ["Tesla V100-SXM2-32GB"]
    assert run["steps_analysed"] == 1 and run["kind"] == "traces"
    assert [r["rank"] for r in d["ranks"]] == list(range(8))
    for r in d["ranks"]:
        assert set(r) >= BREAKDOWN_KEYS
        assert {"steps", "step_ms_mean", "step_ms_median", "step_ms_p90"} <= set(r)
        assert sum(r[k] for k in BREAKDOWN_KEYS) == pytest.approx(r["step_ms_mean"], abs=0.01)
    ops = {(c["op"], c["pg_name"]) for c in d["collectives"]}
    assert ("all_reduce", "0") in ops and ("all_to_all", "0") in ops
    assert all(c["busbw_gbs_median"] > 0 for c in d["collectives"])
    assert d["findings"]
    for f in d["findings"]:
        assert set(f) == FINDING_KEYS
        assert f["severity"] in ("high", "medium", "low")


def test_fail_on_exit_codes(shared_traces, gpudiag):
    # HTA's V100 world-of-one trace (cut to 2 steps): a medium no_amp and a low gpu_idle
    v100 = str(Path(__file__).parent / "fixtures" / "hta_v100_world1")
    assert gpudiag("analyze", "--json", "--fail-on", "high", v100).returncode == 0
    assert gpudiag("analyze", "--json", "--fail-on", "medium", v100).returncode == 1
    # the vLLM trace (no ProfilerStep) has its GPU idle 87 % of the window: high
    b200 = str(shared_traces / "tracelens_b200_vllm")
    assert gpudiag("analyze", "--json", "--fail-on", "high", b200).returncode == 1
    dlrm = str(shared_traces / "param_dlrm_ddp8")
    assert gpudiag("analyze", "--json", "--fail-on", "high", dlrm).returncode == 1


def test_html_is_standalone(shared_traces, gpudiag, tmp_path):
    out = tmp_path / "report.html"
    proc = gpudiag("analyze", "--html", str(out), str(shared_traces / "hta_nccl_a100"))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=", text)  # nothing fetched: opens offline
    assert "Plotly.newPlot" in text and len(text) > 1_000_000  # plotly.js inlined
    assert "exposed_communication" in text


def test_terminal_report_lists_findings_then_ranks(shared_traces, gpudiag):
    proc = gpudiag("analyze", str(shared_traces / "hta_sampled_2of128"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index("Findings") < out.index("Per rank")
    assert "straggler" in out and "fix:" in out
    # 126 of 128 ranks missing: one warning line on stderr
    assert "traces for 126 of 128 ranks are missing" in proc.stderr


def test_bad_input_is_one_line_not_a_traceback(tmp_path, gpudiag):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = gpudiag("analyze", str(empty))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and str(empty) in proc.stderr

    missing = gpudiag("analyze", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file" in missing.stderr

    bad = tmp_path / "traces"
    bad.mkdir()
    (bad / "rank0.pt.trace.json").write_text('{"traceEvents": [')
    with gzip.open(bad / "rank1.pt.trace.json.gz", "wb") as fh:
        fh.write(b'{"not": "a trace"}')
    proc = gpudiag("analyze", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any("rank0.pt.trace.json" in line for line in lines)
    assert lines[-1].startswith("gpudiag: error:")


def test_analyze_does_not_import_torch_rich_or_plotly(shared_traces):
    code = (
        "import sys; from gpudiag.cli import main; import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['analyze', '--json', {str(shared_traces / 'hta_sampled_2of128')!r}])\n"
        "bad = [m for m in ('torch', 'rich', 'plotly', 'streamlit') if m in sys.modules]\n"
        "print(rc, bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "0 []", proc.stderr


def test_compare_two_trace_sets(shared_traces, gpudiag):
    a, b = shared_traces / "hta_sampled_2of128", shared_traces / "tracelens_b200_vllm"
    proc = gpudiag("compare", "--json", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    metrics = {m["metric"]: m for m in d["metrics"]}
    assert {"step_ms_mean", *BREAKDOWN_KEYS} <= set(metrics)
    for m in metrics.values():
        assert m["delta"] == pytest.approx(m["b"] - m["a"])
    text = gpudiag("compare", str(a), str(b))
    assert text.returncode == 0 and "step ms (mean)" in text.stdout and "B − A" in text.stdout
    # not comparable step for step: said first (world size; ranks A could not analyse)
    assert text.stdout.startswith("warning: World size differs")


def _arrow_pool_after(argv: list[str], chosen: str | None, arrow_first: bool = False) -> str:
    """``main(argv)`` in a fresh interpreter (``chosen``: ARROW_DEFAULT_MEMORY_POOL set by
    the user; ``arrow_first``: pyarrow imported before), then its Arrow pool and what a
    process it starts reads."""
    code = (
        f"import os, sys{', pyarrow' if arrow_first else ''}\n"
        "from gpudiag.cli import main\n"
        f"main({argv!r})\n"
        "import pyarrow\n"
        "print(pyarrow.default_memory_pool().backend_name,"
        " os.environ.get('ARROW_DEFAULT_MEMORY_POOL'), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr.strip().splitlines()[-1]


def test_analysing_commands_give_freed_memory_back(tmp_path: Path) -> None:
    """`gpudiag analyze` (and the other analysing commands) use the C allocator for Arrow,
    in their own process and in those they start, unless the user chose a pool; a traced
    job's processes are left as they were."""
    run = str(sample_runs_dir() / "ddp4_straggler")
    assert _arrow_pool_after(["analyze", run, "--json"], None) == "system system"
    # pyarrow imported before: the pool is switched, not only the environment
    assert _arrow_pool_after(["analyze", run, "--json"], None, arrow_first=True) == (
        "system system"
    )
    assert _arrow_pool_after(["analyze", run, "--json"], "mimalloc") == "mimalloc mimalloc"
    script = tmp_path / "show_pool.py"
    script.write_text("import os\nprint('POOL', os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))\n")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "1",
         "--out", str(tmp_path / "run"), str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert "POOL None" in proc.stdout + proc.stderr, proc.stderr[-2000:]
