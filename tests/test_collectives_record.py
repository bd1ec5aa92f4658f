"""Collective recorder on a real 2-rank gloo DDP job (tests/scripts/coll_harness.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

from gpudiag import rundir  # noqa: E402
from gpudiag.capture import ddp  # noqa: E402

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

STEPS = 10  # steps on the hooked model; then 3 on DDP's default path, 3 hooked again,
TRAIN_STEPS = STEPS + 8  # and 2 with the user's own comm hook


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = tmp_path_factory.mktemp("coll_record")
    # ddp_stats rows every step here (the default samples every 10th) so each is checked
    # and gpudiag's timing hook on (opt-in: `gpudiag trace --time-buckets`)
    previous = {k: os.environ.get(k) for k in (ddp.ENV_STATS_EVERY, ddp.ENV_DDP_HOOK)}
    os.environ.update({ddp.ENV_STATS_EVERY: "1", ddp.ENV_DDP_HOOK: "1"})
    try:
        codes, output = coll_launch.finish(coll_launch.start("record", run, steps=STEPS))
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert codes == [0, 0], output
    results = {
        r: json.loads((run / f"rank{r}" / "harness_record.json").read_text()) for r in (0, 1)
    }
    for r, res in results.items():
        assert "error" not in res, (r, res, output)
    return {"run": run, "data": rundir.load_run(run), "results": results}


def _rank(recorded: dict, rank: int):
    c = recorded["data"].collectives
    return c[c["rank"] == rank]


def test_bucket_allreduces_add_up_to_gradient_bytes(recorded: dict) -> None:
    grad_bytes = recorded["results"][0]["grad_bytes"]
    for rank in (0, 1):
        c = _rank(recorded, rank)
        buckets = c[(c["op"] == "all_reduce") & (c["step"] < TRAIN_STEPS)]
        per_step = buckets.groupby("step")["in_bytes"].sum()
        assert sorted(per_step.index) == list(range(TRAIN_STEPS))
        assert (per_step == grad_bytes).all(), per_step
        assert (buckets["dtype"] == "float32").all()
        # each model's first step has one bucket; after DDP rebuilds them, two
        first_steps = {0, STEPS, STEPS + 3, STEPS + 6}
        counts = buckets.groupby("step").size()
        assert (counts.loc[sorted(first_steps)] == 1).all()
        assert (counts.drop(sorted(first_steps)) == 2).all()


def test_sequence_numbers_match_across_ranks(recorded: dict) -> None:
    keys = []
    for rank in (0, 1):
        c = _rank(recorded, rank)
        assert c["record_id"].is_unique
        assert not (c["op"] == "lost").any()
        keys.append(list(zip(c["pg_name"], c["seq"], c["op"], c["in_bytes"], strict=True)))
    assert keys[0] == keys[1]
    world = _rank(recorded, 0)
    world = world[world["pg_name"] == recorded["results"][0]["world_pg_name"]]
    assert list(world["seq"]) == list(range(1, len(world) + 1))


def test_completion_times_after_enqueue_for_timed_collectives(recorded: dict) -> None:
    for rank in (0, 1):
        c = _rank(recorded, rank)
        hooked = c[c["time_source"] == "ddp_hook"]
        # 13 hooked training steps, 2 buckets each after the first step's rebuild
        assert len(hooked) >= 13
        assert (hooked["end_ns"] > hooked["enqueue_ns"]).all()
        assert (hooked["end_ns"] - hooked["enqueue_ns"] < 30e9).all()
        # the steps on DDP's C++ default path have no Python hook: FR only, no times
        untimed = c[(c["op"] == "all_reduce") & c["time_source"].isna()]
        assert set(untimed["step"]) == {STEPS, STEPS + 1, STEPS + 2}


def test_user_comm_hook_timed(recorded: dict) -> None:
    for rank in (0, 1):
        c = _rank(recorded, rank)
        user = c[c["time_source"] == "user_comm_hook"]
        assert set(user["step"]) == {STEPS + 6, STEPS + 7}
        assert len(user) == 3  # one bucket, then two after the rebuild
        assert (user["end_ns"] > user["enqueue_ns"]).all()
    stats = recorded["data"].ddp_stats
    assert set(stats[stats["model"] == 3]["comm_hook"]) == {"allreduce_hook"}


def test_user_collectives_recorded_with_their_seq(recorded: dict) -> None:
    res = recorded["results"][0]
    seqs = res["user_seq"]
    expected = {  # op -> (bytes, dtype): what the harness issued
        "all_reduce": ("all_reduce", 4000, "float32"),
        "broadcast": ("broadcast", 616, "float64"),
        "all_gather": ("all_gather", 132, "int32"),
        "async_all_reduce": ("all_reduce", 220, "float32"),
    }
    for rank in (0, 1):
        c = _rank(recorded, rank).set_index(["pg_name", "seq"])
        for name, (op, nbytes, dtype) in expected.items():
            row = c.loc[(res["world_pg_name"], seqs[name])]
            assert (row["op"], row["in_bytes"], row["dtype"]) == (op, nbytes, dtype), name
            assert row["time_source"] == "dist"
            assert row["end_ns"] > row["enqueue_ns"]
        sub = c.loc[(res["sub_pg_name"], seqs["sub_all_reduce"])]
        assert seqs["sub_all_reduce"] == 1  # subgroups restart at 1: keyed on (pg, seq)
        assert (sub["op"], sub["in_bytes"], sub["pg_size"], sub["pg_ranks"]) == (
            "all_reduce",
            176,
            2,
            [0, 1],
        )
        assert sub["time_source"] == "dist"


def test_seq_predicted_before_issue_matches_flight_recorder(recorded: dict) -> None:
    for rank in (0, 1):
        path = rundir.table_path(rundir.rank_dir(recorded["run"], rank), rundir.COLLECTIVE_TIMES)
        rows = list(rundir.iter_jsonl(path))
        assert len(rows) >= 18
        assert not [r for r in rows if "seq_predicted" in r]
        assert all(r["pg_name"] is not None and r["seq"] >= 1 for r in rows)
        user = [r for r in rows if r["source"] == "dist"]
        assert all("coll_harness.py" in r["callsite"] for r in user)
        # bucket all-reduces point at the user's backward() line
        hooked = {r["callsite"] for r in rows if r["source"] == "ddp_hook"}
        assert len(hooked) == 1 and "coll_harness.py" in hooked.pop()


def test_comm_hook_bit_identical_to_ddp_default(recorded: dict) -> None:
    for rank in (0, 1):
        assert recorded["results"][rank]["identical"] is True


def test_ddp_stats_rows(recorded: dict) -> None:
    stats = recorded["data"].ddp_stats
    grad_bytes = recorded["results"][0]["grad_bytes"]
    for rank in (0, 1):
        s = stats[(stats["rank"] == rank) & (stats["model"] == 0)]
        assert list(s["step"]) == list(range(len(s)))
        assert len(s) == TRAIN_STEPS + 1
        later = s[s["step"] >= 2]
        assert (later["avg_backward_comm_time"] > 0).all()
        assert (later["avg_forward_compute_time"] > 0).all()
        assert sum(later["rebuilt_bucket_sizes"].iloc[-1]) == grad_bytes
        assert (s["comm_hook"] == "timed_allreduce_hook").all()  # gpudiag's, on gloo


def test_summary_totals_match_table(recorded: dict) -> None:
    for rank in (0, 1):
        summary = recorded["results"][rank]["summary"]
        c = _rank(recorded, rank)
        totals = c.groupby(["op", "pg_name"])["in_bytes"].agg(["count", "sum"])
        for entry in summary["collectives"]:
            count, nbytes = totals.loc[(entry["op"], entry["pg_name"])]
            assert (entry["count"], entry["bytes"]) == (count, nbytes)
        path = rundir.table_path(rundir.rank_dir(recorded["run"], rank), rundir.COLLECTIVE_TIMES)
        world = recorded["results"][0]["world_pg_name"]
        timed = [
            t
            for t in rundir.iter_jsonl(path)
            if (t["op"], t["pg_name"]) == ("all_reduce", world) and t["end_ns"]
        ]
        entry = next(
            e for e in summary["collectives"] if (e["op"], e["pg_name"]) == ("all_reduce", world)
        )
        assert entry["known_time_ns"] == sum(t["end_ns"] - t["call_ns"] for t in timed) > 0
        assert summary["fr_lost_records"] == 0
        assert summary["fr_dumps"] >= 2


def test_ring_losses_detected(tmp_path: Path) -> None:
    codes, output = coll_launch.finish(
        coll_launch.start(
            "ring", tmp_path, world_size=1, steps=12, extra_env={"TORCH_FR_BUFFER_SIZE": "16"}
        )
    )
    assert codes == [0], output
    res = json.loads((tmp_path / "rank0" / "harness_ring.json").read_text())
    c = rundir.load_run(tmp_path).collectives
    lost = c[c["op"] == "lost"]
    kept = c[c["op"] != "lost"]
    assert res["summary"]["fr_lost_records"] == lost["lost_records"].sum() > 0
    # every FR record is either written or counted lost; none twice
    assert len(kept) + lost["lost_records"].sum() == kept["record_id"].max() + 1
    assert kept["record_id"].is_unique
    assert res["issued"] == 48
