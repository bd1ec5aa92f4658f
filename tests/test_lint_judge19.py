"""Nineteenth judge: the messages that must fit their case (the findings themselves are
checked by the case folders of tests/lint_cases/issue30)."""

from __future__ import annotations

from gpudiag.lint import RULES, lint_paths
from tests.lint_messages import CASES, at, findings


def test_collective_in_a_helper_names_the_per_step_call_site() -> None:
    message, _ = at(findings("collective_helper", "GD704"), "dist.all_reduce(")
    assert "all_reduce, in reduce_tensor(), called every step at" in message
    assert message.endswith("collective_helper/train.py:23")


def test_set_epoch_fix_fits_a_cycled_loader() -> None:
    message, fix = at(findings("cycled_loader", "GD202"), "DistributedSampler(")
    assert "itertools.cycle" in message
    assert "set_epoch" in fix and "cycle" in fix and fix != RULES["GD202"].fix


def test_synchronize_of_an_event_timer_gets_a_timing_fix() -> None:
    result = lint_paths([CASES / "event_timer"], select=["GD"])
    syncs = sorted((f.line, f.message, f.to_json()["fix"]) for f in result.findings)
    assert len(syncs) == 2
    (_, timer, timer_fix), (_, plain, plain_fix) = syncs
    assert "CUDA-event timer" in timer and "every N steps" in timer_fix
    assert "profiler" in timer_fix
    assert "CUDA-event timer" not in plain and plain_fix == RULES["GD301"].fix


def test_meter_update_message_says_what_reads_the_tensor() -> None:
    found = findings("meter_update", "GD301")
    assert "passes it to max()" in at(found, "maxp_meter.update(max_t)")[0]
    assert "compares it" in at(found, "best_meter.update(")[0]


def test_several_backwards_say_no_sync_or_one_backward() -> None:
    message, fix = at(findings("several_backwards", "GD602"), "err_real.backward(")
    assert "2 backward() calls before one optimizer step" in message
    assert "no_sync()" in fix and "backward() once" in fix
