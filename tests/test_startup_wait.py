"""A rank that prepares alone before DDP(model) keeps the others waiting in their first
collectives: reported once, as start-up, never as a per-step cost (issue 29, probe 29i
class 7: a 4 s wait before DDP() was reported nowhere).

Recorded runs (tests/fixtures/startup_wait, see its README entry): the same 2-rank gloo
job, rank 0 sleeping 4 s after init_process_group, and not at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analysis import analyze

RECORDED = Path(__file__).parent / "fixtures" / "startup_wait"


def test_a_rank_preparing_alone_before_ddp_is_a_start_up_wait_once() -> None:
    result = analyze(RECORDED / "rank0_prepares_4s")
    (found,) = [f for f in result.findings if f.kind == "startup_wait"]
    assert found.severity == "low" and found.cost_ms_per_step == 0.0
    assert found.ranks == [0], found.title
    waited = found.evidence["wait_ms_per_rank"]["1"]
    assert 4000 <= waited <= 10000, found.evidence  # the 4 s sleep and DDP's own set-up
    assert found.evidence["longest_call"]["op"] == "all_gather"
    assert "once, not per step" in found.title and "rank 1: " in found.title
    assert "rank 0: " not in found.title  # the late rank waited for nobody
    # the wait is no step's: no other finding carries it
    assert all(f.cost_ms_per_step < 100 for f in result.findings), result.findings


def test_ranks_that_start_together_have_no_start_up_wait() -> None:
    result = analyze(RECORDED / "no_wait")
    assert not [f for f in result.findings if f.kind == "startup_wait"]


@pytest.mark.slow
def test_every_view_shows_the_start_up_wait() -> None:
    """Terminal and JSON from the CLI, as a user runs them."""
    run = str(RECORDED / "rank0_prepares_4s")
    text = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", run], capture_output=True, text=True
    )
    assert text.returncode == 0 and "startup_wait" in text.stdout, text.stderr
    as_json = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", run, "--json"],
        capture_output=True,
        text=True,
    )
    kinds = [f["kind"] for f in json.loads(as_json.stdout)["findings"]]
    assert "startup_wait" in kinds
