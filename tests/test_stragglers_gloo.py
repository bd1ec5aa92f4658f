"""Core analysis on 2-rank gloo DDP runs recorded here with torch.profiler.

One run is recorded once per session, with rank 1 slowed by 50 ms in forward (an
unmodified run on 2 shared cores has ranks late in turn by up to tens of ms, so "no
straggler" is tested on constructed skew in test_stragglers.py instead). Workers end with os._exit after exporting (gloo teardown abort, FACTS.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis import comms, stragglers
from gpudiag.analysis.breakdown import COMPONENTS, comm_comp_overlap, run_breakdown
from gpudiag.analysis.ingest import RankTrace, find_traces, load_traces, with_comm

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

STEPS = 5
SLOW_MS = 50

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    out, slow_rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])

        def forward(self, x):
            if rank == slow_rank:
                time.sleep(0.05)
            return self.body(x)


    model = DDP(Net(), bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256)


    def step():
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


    for _ in range(3):
        step()
    schedule = torch.profiler.schedule(wait=0, warmup=0, active=steps + 1, repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=schedule
    ) as prof:
        for _ in range(steps):
            step()
            prof.step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.pt.trace.json"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_gloo_run(out: Path, slow_rank: int, steps: int = STEPS) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    script = out / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(script),
        str(out),
        str(slow_rank),
        str(steps),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def slowed_run(tmp_path_factory: pytest.TempPathFactory) -> list[RankTrace]:
    out = record_gloo_run(tmp_path_factory.mktemp("gloo_slow"), slow_rank=1)
    warnings: list[str] = []
    traces = load_traces(find_traces(out), warnings=warnings)
    assert warnings == []
    return traces


def test_ingest_gloo_threads_and_kinds(slowed_run: list[RankTrace]) -> None:
    assert [t.meta.rank for t in slowed_run] == [0, 1]
    for t in slowed_run:
        assert t.meta.backend == "gloo" and t.meta.world_size == 2
        assert len(t.steps) == STEPS  # the stub step opened by the last prof.step() is dropped
        ev = t.events
        transfers = with_comm(ev[ev["kind"] == "comm"], t.comm)
        assert len(transfers) >= STEPS
        assert transfers["name"].astype(str).str.startswith("gloo:").all()
        assert transfers["thread_name"].astype(str).str.contains("pt_gloo_runloop").all()
        assert not transfers["main_thread"].any()
        enqueues = with_comm(ev[(ev["kind"] == "comm_cpu") & ev["main_thread"]], t.comm)
        assert (enqueues["comm_op"] == "all_reduce").all() and len(enqueues) == len(transfers)
        assert (transfers["comm_bytes"] > 0).all()  # from Input Dims x float
        assert (ev.loc[ev["main_thread"], "kind"] == "step").sum() == STEPS + 1


def test_straggler_is_exactly_the_slowed_rank(slowed_run: list[RankTrace]) -> None:
    table = comms.collective_table(slowed_run)
    skew = stragglers.arrival_skew(table)
    result = stragglers.stragglers(skew, run_breakdown(slowed_run))
    named = result[result["is_straggler"]]["rank"].tolist()
    assert named == [1]
    cost = result.set_index("rank")["cost_ms_per_step"]
    assert 0.7 * SLOW_MS < cost[1] < 2 * SLOW_MS
    assert cost[0] < 5
    late = skew[skew["rank"] == 1]
    assert late["is_last"].mean() > 0.9


def test_breakdown_sums_and_shows_the_wait(slowed_run: list[RankTrace]) -> None:
    bd = run_breakdown(slowed_run)
    assert len(bd) == 2 * STEPS
    assert np.allclose(bd[list(COMPONENTS)].sum(axis=1), bd["step_ms"], atol=1e-6)
    assert (bd[list(COMPONENTS)] >= 0).all().all()
    per_rank = bd.groupby("rank")[list(COMPONENTS)].mean()
    # rank 0 waits for rank 1 with nothing to compute: exposed communication
    assert per_rank.loc[0, "comm_exposed"] > 0.6 * SLOW_MS
    # rank 1 sleeps in forward: Python time with no operator running, inside the
    # DistributedDataParallel.forward range: "other" host time, not compute
    assert per_rank.loc[1, "other"] > 0.8 * SLOW_MS
    assert per_rank.loc[1, "compute"] < per_rank.loc[1, "other"] / 2
    assert per_rank.loc[1, "comm_exposed"] < per_rank.loc[0, "comm_exposed"] / 3
    for t in slowed_run:
        assert 0 <= comm_comp_overlap(t) <= 100


def test_collectives_buckets_and_stall(slowed_run: list[RankTrace]) -> None:
    table = comms.collective_table(slowed_run)
    counts = table.groupby("rank").size()
    assert counts[0] == counts[1] and counts[0] % STEPS == 0
    assert set(table["op"]) == {"all_reduce"}
    assert (table["pg_size"] == 2).all()
    assert (table["busbw_gbs"] == table["algbw_gbs"]).all()  # 2(n-1)/n = 1 for n = 2
    summary = comms.collective_summary(table)
    assert summary.loc[0, "op"] == "all_reduce" and summary.loc[0, "count"] == counts[0]
    buckets = comms.ddp_buckets(table)
    per_step = buckets.groupby(["rank", "step"]).size()
    assert per_step.nunique() == 1 and per_step.iloc[0] >= 2  # bucket_cap_mb=0.25: several
    # 6 x Linear(256, 256) floats = 6 x 65792 x 4 bytes, split over the buckets
    step_bytes = buckets.groupby(["rank", "step"])["bytes"].sum()
    assert (step_bytes == 6 * 65792 * 4).all()
    stall = comms.allreduce_stall(slowed_run, table).groupby("rank")["stall_ms"].mean()
    assert stall[0] > 0.6 * SLOW_MS  # rank 0 waits for the slow rank's buckets
    assert stall[1] < stall[0] / 3


def test_comm_per_step_equals_tb_profiler_on_gloo(slowed_run: list[RankTrace]) -> None:
    """torch-tb-profiler's distributed view counts gloo:* spans as Communication."""
    data = pytest.importorskip("torch_tb_profiler.profiler.data")
    import json
    import logging

    logging.getLogger("torch_tb_profiler").setLevel(logging.ERROR)
    per_step = comms.comm_per_step(slowed_run)
    for t in slowed_run:
        doc = json.loads(t.meta.path.read_bytes())
        profile = data.RunProfileData.from_json("w", "s", doc)
        tb = {
            int(n): c.communication / 1000
            for n, c in zip(profile.steps_names, profile.comm_overlap_costs, strict=True)
        }
        ours = per_step[per_step["rank"] == t.meta.rank]
        assert len(ours) == STEPS
        for step, ms in zip(ours["step"], ours["comm_ms"], strict=True):
            assert abs(ms - tb[step]) < 0.01, (t.meta.rank, step, ms, tb[step])
