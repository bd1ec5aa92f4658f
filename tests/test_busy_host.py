"""Findings on a busy host (issue 29): real 2-rank gloo DDP jobs recorded with `gpudiag
trace` while CPU-hogging processes run beside them, as on a shared training host.

A rank that sleeps is slow by itself, not short of CPU: it is named at full severity with
its cost, even though the host is loaded, while the healthy job on the same loaded host
gets nothing above low. A rank whose CPU is taken by other processes (its run-queue delay,
from the training thread's /proc schedstat) is starved: that is said, at low severity.
Also: a straggler caused by its own data wait is linked to it and projected once; a wait
at one end-of-run collective is spread over the run's steps; the steady step time."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis import steady as steady_mod

pytestmark = pytest.mark.slow

TRAIN = Path(__file__).parent / "scripts" / "findings_train.py"
JOB_TIMEOUT_S = 300
HOGS = 3
SLOW_MS = 50.0
ALLOWED = ("high", "medium")
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@contextmanager
def _hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPUs, killed by pid."""
    procs = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", "while 1: pass"]))
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _trace(out: Path, *args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "gpudiag",
        "trace",
        "--nproc-per-node",
        "2",
        "--standalone",
        "--no-lint",
        "--out",
        str(out),
        str(TRAIN),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("busy_host")
    steps = ("--steps", "30")
    with _hogs(HOGS):
        _trace(root / "busy_slow", *steps, "--slow-rank", "1", "--slow-ms", str(SLOW_MS))
        _trace(root / "busy_healthy", *steps)
    if len(os.sched_getaffinity(0)) >= 2:  # rank 1 on CPU 1 with 3 spinning processes
        _trace(root / "starved", *steps, "--pin", "--starve-rank", "1", "--width", "512")
    _trace(root / "data_rank", *steps, "--data-ms", str(SLOW_MS), "--data-rank", "1")
    _trace(root / "one_call", "--steps", "20", "--no-ddp", "--slow-rank", "1", "--slow-ms", "600")
    return {p.name: p for p in root.iterdir()}


def _worst(result) -> str | None:
    found = sorted(result.findings, key=lambda f: SEVERITY_ORDER[f.severity])
    return found[0].severity if found else None


def test_a_sleeping_rank_on_a_busy_host_is_named_at_full_severity(runs) -> None:
    result = analyze(runs["busy_slow"])
    (straggler,) = [f for f in result.findings if f.kind == "straggler"]
    assert straggler.ranks == [1]
    assert straggler.severity in ALLOWED, straggler.title
    assert straggler.cost_ms_per_step == pytest.approx(SLOW_MS, rel=0.2)
    # it slept: off the CPU, not waiting for one
    assert straggler.evidence["starved_of_cpu"] is False
    assert straggler.evidence["main_cause"] == "blocked"
    assert "off the CPU" in straggler.title and "sleep" in straggler.fix


# A CPU gloo all-reduce really is exposed (docs/findings.md): not scored on a healthy job,
# as in the labelled suite and bench/frameworks_suite.py.
UNSCORED = {"exposed_communication", "bucket_size"}


def test_the_healthy_job_on_the_same_busy_host_has_nothing_above_low(runs) -> None:
    healthy = analyze(runs["busy_healthy"])
    # the straggler: test below
    accused = [f for f in healthy.findings if f.kind not in UNSCORED | {"straggler"}]
    assert not [f for f in accused if f.severity in ALLOWED], [
        (f.kind, f.severity, f.title) for f in healthy.findings
    ]
    # no inversion: the injected problem ranks at least as high as anything the healthy
    # run shows
    slow = analyze(runs["busy_slow"])
    straggler = next(f for f in slow.findings if f.kind == "straggler")
    worst = _worst(healthy)
    assert worst is None or SEVERITY_ORDER[straggler.severity] <= SEVERITY_ORDER[worst]


def test_no_false_straggler_on_the_busy_host(runs) -> None:
    # (was a false 2-10 ms high straggler in about 1 of 3 runs: issue 29; the recorded case
    # is tests/test_busy_host_recorded.py)
    healthy = analyze(runs["busy_healthy"])
    assert not [f for f in healthy.findings if f.kind == "straggler" and f.severity in ALLOWED]


def test_a_rank_starved_of_cpu_is_said_to_be_starved(runs) -> None:
    if "starved" not in runs:
        pytest.skip("needs 2 CPUs to starve one rank")
    result = analyze(runs["starved"])
    times = steady_mod.rank_times(result.run_steps)
    # the spinning processes took rank 1's CPU: its training thread waited for it
    # (measured), at least as long as it ran
    assert times[1].runq_ms is not None and times[1].cpu_ms is not None
    assert times[1].runq_ms > times[1].cpu_ms
    for finding in result.findings:
        if finding.kind == "straggler" and 1 in finding.ranks:
            assert finding.severity == "low"
            assert finding.evidence["starved_of_cpu"] is True
            assert "waiting for a CPU" in finding.title


def test_a_straggler_caused_by_its_data_wait_is_linked_and_projected_once(runs) -> None:
    result = analyze(runs["data_rank"])
    kinds = {f.kind: f for f in result.findings}
    stall, straggler = kinds["dataloader_stall"], kinds["straggler"]
    assert stall.ranks == [1] and straggler.ranks == [1]
    assert stall.cost_ms_per_step == pytest.approx(SLOW_MS, rel=0.2)
    assert straggler.evidence["main_cause"] == "data"
    assert straggler.evidence["caused_by"] == "dataloader_stall"
    scenarios = {p.scenario: p for p in result.whatif}
    assert "straggler_fixed" not in scenarios
    assert any("counted once" in a for a in scenarios["dataloader_fixed"].assumptions)


def test_a_wait_at_one_collective_is_spread_over_the_run(runs) -> None:
    result = analyze(runs["one_call"])
    (straggler,) = [f for f in result.findings if f.kind == "straggler"]
    assert straggler.severity == "low"
    steps = straggler.evidence["spread_over_run_steps"]
    assert steps >= 15
    # rank 1 slept 600 ms before the only collective: per step of the run, about 600 / steps
    # (plus how much later it started), never the whole wait as if every step had it
    assert straggler.cost_ms_per_step < 3 * 600 / steps
    assert "not shown to be consistent" in straggler.title


def test_steady_step_is_the_median_of_every_recorded_step_after_warm_up(runs) -> None:
    run = runs["busy_healthy"]
    rows = []
    for rank in (0, 1):
        lines = (run / f"rank{rank}" / "steps.jsonl").read_text().splitlines()
        rows.append([json.loads(line) for line in lines])
    assert all("cpu_ns" in r and "runq_ns" in r for r in rows[0] + rows[1])
    # the reference: 30 steps, warm-up 10 % = the first 3
    durations = [(r["end_ns"] - r["start_ns"]) / 1e6 for part in rows for r in part[3:]]
    result = analyze(run)
    assert result.run.steady_step_ms == pytest.approx(statistics.median(durations))
    assert result.to_json()["run"]["steady_step_ms"] == pytest.approx(
        result.run.steady_step_ms, abs=1e-3
    )
