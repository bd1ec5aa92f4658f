"""The terminal report when stdout is a file or a pipe (CI logs, `| tee`): no number is
cut to fit 80 columns, and several runs end with one summary line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the CLI in subprocesses

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


def _analyze(*args: str, tmp_path: Path) -> str:
    out = tmp_path / "report.txt"
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    env.pop("FORCE_COLOR", None)
    with open(out, "w") as fh:  # stdout is a file, not a terminal
        subprocess.run(
            [sys.executable, "-m", "gpudiag", "analyze", *args],
            stdout=fh,
            stderr=subprocess.DEVNULL,
            env=env,
            check=True,
            timeout=300,
        )
    return out.read_text()


def _json(path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(path), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=300,
    )
    return json.loads(proc.stdout)


def test_piped_report_keeps_every_number(tmp_path: Path) -> None:
    path = FIXTURES / "kineto_2021_v100"
    text = _analyze(str(path), tmp_path=tmp_path)
    assert "…" not in text  # rich's ellipsis: nothing was cut
    (row,) = _json(path)["ranks"]
    line = next(ln for ln in text.splitlines() if ln.strip("│ ").startswith("0 "))
    for key in ("step_ms_mean", "step_ms_p90", "compute", "data_loading", "idle", "other"):
        assert f"{row[key]:.2f}" in line, (key, line)


def test_several_runs_end_with_a_summary_line_each(tmp_path: Path) -> None:
    paths = [FIXTURES / "kineto_2021_v100", FIXTURES / "hta_v100_world1"]
    text = _analyze(*map(str, paths), tmp_path=tmp_path)
    tail = text.rstrip().splitlines()[-3:]
    assert tail[0] == "Summary (2 runs)"
    for path, line in zip(paths, tail[1:], strict=True):
        result = _json(path)
        assert line.startswith(f"{path}: step ")
        assert f"{len(result['findings'])} findings" in line
        # the reports' one order: severity, then cost (report/overview.ordered_findings)
        rank = {"high": 0, "medium": 1, "low": 2}
        first = min(
            result["findings"], key=lambda f: (rank[f["severity"]], -(f["cost_ms_per_step"] or 0))
        )
        assert f"first: {first['kind']} {first['cost_ms_per_step']:.2f} ms/step" in line


RUN = REPO / "sample_runs" / "ddp4_straggler"
OTHER = REPO / "sample_runs" / "ddp2_healthy"


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", str(RUN)],
        ["analyze", str(RUN), "--json"],
        ["compare", str(RUN), str(OTHER)],
        ["whatif", str(RUN)],
        ["watch", str(RUN), "--once"],
        ["watch", str(RUN), "--once", "--json"],
        ["lint", str(REPO / "tests" / "scripts" / "rel_job.py")],
        ["--help"],
        ["--version"],
        ["lint", "--help"],
    ],
    ids=[
        "analyze",
        "analyze-json",
        "compare",
        "whatif",
        "watch",
        "watch-json",
        "lint",
        "usage",  # was a BrokenPipeError traceback (`gpudiag --help | head -5`)
        "version",
        "command-help",
    ],
)
def test_a_closed_pipe_ends_the_command_quietly_with_0(args: list[str]) -> None:
    """`gpudiag analyze RUN | head -1`: once the reader is gone, every printing command
    ends with exit 0 and says nothing (was: exit 1 through rich's broken-pipe handler,
    exit 2 "cannot write the report" for --json, or a BrokenPipeError at exit). The
    pipe's reading end is closed before the command writes a byte, so every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "error" not in proc.stderr, proc.stderr
