"""Small framework collectives are synchronisation points, not gradient transfer (issue 29,
class 1), on two runs recorded here (tests/fixtures/sync_points, see its README): a tiny
Lightning Trainer, 2 ranks on gloo, logging its loss with ``sync_dist=True`` every step
(Lightning then runs a barrier and a 4-byte all_reduce per step, beside its own 8-byte
SIGTERM-flag broadcast), and the same job without ``sync_dist``.

Before, the exposed time inside those calls was costed as the gradient sync's transfer:
6.17 ms per step of an 11.9 ms step on the sync_dist run, with advice (bucket size,
overlap, no_sync) that cannot give it back, and the what-if's "last bucket" was the
metric's all_reduce."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.findings import ExposedSplit, _microstep_sync_finding
from gpudiag.analysis.gradient_sync import GradientSyncRounds
from gpudiag.analysis.sync_points import SyncPoint, SyncPoints, _gains, sync_point_findings
from gpudiag.rundir import load_run

RECORDED = Path(__file__).parent / "fixtures" / "sync_points"
SYNC_DIST = RECORDED / "lightning_sync_dist_2r"
NO_SYNC_DIST = RECORDED / "lightning_no_sync_dist_2r"


@pytest.fixture(scope="module")
def sync_dist():
    return analyze(SYNC_DIST)


def _kind(result, kind):
    return [f for f in result.findings if f.kind == kind]


def test_the_capture_records_the_framework_line_that_issued_a_collective() -> None:
    calls = load_run(SYNC_DIST).collectives
    sites = set(calls["library_callsite"].dropna())
    assert any(s.endswith("training_epoch_loop.py:265 in _broadcast_sigterm_tensor") for s in sites)
    assert any("_sync_ddp" in s for s in sites)
    users = set(calls["callsite"].dropna())
    assert any(s.endswith("lightning_sync_dist.py:26 in training_step") for s in users)


def test_each_framework_sync_point_is_its_own_finding_naming_its_line(sync_dist) -> None:
    points = {(f.evidence["op"], f.evidence["bytes"]): f for f in _kind(sync_dist, "sync_point")}
    assert set(points) == {("barrier", 0), ("broadcast", 8), ("all_reduce", 4)}
    sigterm = points[("broadcast", 8)]
    assert "training_epoch_loop.py:265 in _broadcast_sigterm_tensor" in sigterm.title
    # what removing it gives back, over the run's 29 steps after the first (0-29)
    assert sigterm.cost_ms_per_step == pytest.approx(1.97, abs=0.01)
    assert sigterm.evidence["steps_counted"] == 29
    metric = points[("all_reduce", 4)]
    assert "sync_dist=True" in metric.fix and "bucket" not in metric.title
    assert metric.location and metric.location.endswith("lightning_sync_dist.py:26")
    assert points[("barrier", 0)].cost_ms_per_step == pytest.approx(2.28, abs=0.01)
    # Lightning's one-off start-up barriers and broadcasts are no per-step sync point
    assert all(f.evidence["calls_per_step"] == 1.0 for f in points.values())
    # the host's training threads waited 21 % of the step for a CPU: rated on the rest
    assert {f.severity for f in points.values()} == {"low"}


def test_exposed_gradient_transfer_leaves_the_sync_points_out(sync_dist) -> None:
    (exposed,) = _kind(sync_dist, "exposed_communication")
    ev = exposed.evidence
    # before: 6.17 ms, the sync points' 4.4 ms of latency included
    assert exposed.cost_ms_per_step == pytest.approx(1.77, abs=0.01)
    assert ev["sync_points_ms"] == pytest.approx(4.40, abs=0.01)
    # each ms once: peers' wait + sync points' latency + transfer = the exposed time
    parts = ev["waiting_for_peers_ms"] + ev["sync_points_ms"] + ev["transfer_ms"]
    assert parts == pytest.approx(ev["comm_exposed_ms"], abs=0.005)
    # the per-rank table's split (every view draws it) gives the finding's transfer
    ranks = sync_dist.ranks
    window = float((ranks["comm_exposed"] - ranks["comm_wait"]).mean())
    assert window * ev["window_scale"] == pytest.approx(exposed.cost_ms_per_step, abs=0.005)


def test_whatif_projects_the_sync_points_nowhere(sync_dist) -> None:
    savings = {p.scenario: p.saving_ms for p in sync_dist.whatif}
    (exposed,) = _kind(sync_dist, "exposed_communication")
    assert savings["comm_overlapped"] == pytest.approx(exposed.cost_ms_per_step)
    # before: comm_bucketed took the metric's 4-byte all_reduce as the last gradient bucket
    assert "comm_bucketed" not in savings
    assert not any(p.finding_kind == "sync_point" for p in sync_dist.whatif)


def test_without_sync_dist_only_the_framework_broadcast_is_left() -> None:
    result = analyze(NO_SYNC_DIST)
    (point,) = _kind(result, "sync_point")
    assert (point.evidence["op"], point.evidence["bytes"]) == ("broadcast", 8)
    assert "sync_dist" not in point.fix.split("self.log")[0]
    assert point.severity == "low"


def _point(gain_ms: float) -> SyncPoints:
    latency = {0: 0.1, 1: 2.0}
    p = SyncPoint("all_reduce", 4, "/x/train.py:12 in step", None, 1.0, 3.0, 1.05, latency, gain_ms)
    return SyncPoints((p,), latency)


def test_a_sync_point_is_rated_on_what_removing_it_gives_back() -> None:
    (high,) = sync_point_findings(_point(3.0), step_ms=10.0)
    assert (high.severity, high.cost_ms_per_step) == ("high", 3.0)
    assert high.location == "/x/train.py:12"
    assert "sync_dist=True" in high.fix
    (loaded,) = sync_point_findings(_point(3.0), step_ms=10.0, runq_share=0.2)
    assert loaded.severity == "low"
    assert sync_point_findings(_point(0.1), step_ms=10.0) == []


def _calls(end_ms: tuple[float, float], next_ms: tuple[float, float]) -> pd.DataFrame:
    ns = 1_000_000
    return pd.DataFrame(
        {
            "rank": [0, 1],
            "group_id": [0, 0],
            "start_ns": [0, 0],
            "last_ns": [0, 0],
            "end_ns": [int(e * ns) for e in end_ms],
            "next_ns": [float(n * ns) for n in next_ms],
        }
    )


def test_a_call_gives_back_only_what_delays_the_rank_the_step_waits_for() -> None:
    # rank 1 leaves 3 ms after both arrived and is the last at its next collective
    late = _calls((0.1, 3.0), (5.0, 8.0))
    assert _gains(late, set()).iloc[0] == pytest.approx(3e6)
    # a named straggler's own time in it is costed under straggler, not twice
    assert _gains(late, {1}).iloc[0] == 0.0
    # rank 0 stays 4 ms, but rank 1 is still computing: only rank 1's 0.1 ms counts
    overlapped = _calls((4.0, 0.1), (5.0, 8.0))
    assert _gains(overlapped, set()).iloc[0] == pytest.approx(0.1e6)


def test_no_sync_cost_leaves_the_sync_points_out() -> None:
    rounds = GradientSyncRounds(rounds_per_step=4, buckets=2, steps=18, ranks=[0, 1])
    split = ExposedSplit(gross_ms=50.0, waiting_ms=10.0, unknown_ms=0.0)
    before = _microstep_sync_finding(rounds, split, 200.0, None)
    after = _microstep_sync_finding(rounds, split, 200.0, None, sync_exposed_ms=10.0)
    assert before is not None and after is not None
    assert before.cost_ms_per_step == pytest.approx(37.5)
    assert after.cost_ms_per_step == pytest.approx(30.0)
    assert after.evidence["sync_points_ms"] == 10.0


def test_a_trace_s_small_broadcast_gets_advice_that_does_not_guess_its_caller() -> None:
    latency = {0: 0.5, 1: 0.4}
    p = SyncPoint("broadcast", 96, None, None, 1.0, 0.8, 0.45, latency, 2.0, 4)
    (found,) = sync_point_findings(SyncPoints((p,), latency), step_ms=24.0)
    assert "broadcast_buffers=False" in found.fix and "sync_dist" not in found.fix
    assert found.location is None


def test_the_no_sync_title_gives_the_share_its_severity_is_rated_on() -> None:
    # the frameworks suite's accelerate case beside three hogs: 49.80 ms of a 505.07 ms
    # step is 9.86 %, low; its title said "10% of the step"
    rounds = GradientSyncRounds(rounds_per_step=4, buckets=2, steps=18, ranks=[0, 1])
    split = ExposedSplit(gross_ms=66.4, waiting_ms=10.0, unknown_ms=0.0)
    found = _microstep_sync_finding(rounds, split, 505.07, None)
    assert found is not None and found.severity == "low"
    assert "9.9 % of the step" in found.title
