"""Stragglers on a busy host (issue 29), on two runs recorded here beside three CPU hogs
(tests/fixtures/busy_host, see its README): a healthy 2-rank job where one rank came last
by 10 ms per step for no reason of its own, and a job whose rank 1 sleeps 50 ms per step.

The healthy rank's lead is not explained by anything it does: its training thread waited
for a CPU 4.8 ms per step more than its peer, and its other threads (the intra-op workers
the training thread waits for off the CPU) 6 ms more. It must not be called a high
straggler. The sleeping rank's lead is its own: off the CPU, high, at its cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.analysis import analyze, slow_rank, steady

RECORDED = Path(__file__).parent / "fixtures" / "busy_host"


def _straggler(name: str):
    result = analyze(RECORDED / name)
    found = [f for f in result.findings if f.kind == "straggler"]
    return result, found


def test_a_healthy_rank_late_on_a_busy_host_is_not_a_high_straggler() -> None:
    _, found = _straggler("healthy_rank0_late")
    (straggler,) = found
    assert straggler.ranks == [0]
    assert straggler.severity == "low", straggler.title
    assert straggler.evidence["unexplained_on_busy_host"] is True
    assert straggler.evidence["main_cause"] is None
    assert straggler.evidence["threads_runq_extra_ms_per_step"] > 1.0
    assert "it may be the scheduler's" in straggler.title


def test_a_sleeping_rank_on_a_busy_host_stays_high_at_its_cost() -> None:
    _, found = _straggler("rank1_sleeps_50ms")
    (straggler,) = found
    assert straggler.ranks == [1]
    assert straggler.severity == "high", straggler.title
    assert straggler.cost_ms_per_step == pytest.approx(50.0, rel=0.2)
    assert straggler.evidence["main_cause"] == "blocked"
    assert "unexplained_on_busy_host" not in straggler.evidence
    # its other threads waited for a CPU too, but that does not hide its own 50 ms
    assert straggler.evidence["threads_runq_extra_ms_per_step"] > 0


def test_blocked_names_the_cause_only_without_the_threads_run_queue() -> None:
    """The same figures as the healthy run's, by hand: the training thread's parts alone
    would leave 'blocked' the main part; the other threads' run queue says it is not."""
    base = dict(steps=27, data_ms=0.1)
    times = {
        0: steady.RankTime(
            rank=0, step_ms=15.0, cpu_ms=3.1, runq_ms=0.3, threads_runq_ms=1.0, **base
        ),
        1: steady.RankTime(
            rank=1, step_ms=15.0, cpu_ms=3.1, runq_ms=2.0, threads_runq_ms=9.0, **base
        ),
    }
    cause = slow_rank.explain(1, 10.0, times)
    assert cause is not None
    assert cause.extra_ms["blocked"] > slow_rank.MAIN_SHARE * 10.0  # the parts as before
    assert cause.main is None  # but not named the cause
    without_threads = {
        r: steady.RankTime(**{**t.__dict__, "threads_runq_ms": t.runq_ms}) for r, t in times.items()
    }
    again = slow_rank.explain(1, 10.0, without_threads)
    assert again is not None and again.main == "blocked"
