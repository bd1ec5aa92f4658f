"""Test harness for the collective recorder: one rank of a 2-rank gloo job.

Started by tests/test_collectives_*.py / test_hang*.py with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. Usage: coll_harness.py MODE RUN_DIR [STEPS]
Modes: record (DDP + user collectives), hang (rank 1 skips an all_reduce), desync (ranks
all_reduce different sizes at the same seq). Ends with os._exit after flushing (the gloo
teardown abort in ../shared/FACTS.md).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpudiag import rundir
from gpudiag.capture.collectives import CollectiveRecorder, dump_flight_recorder, worker_env
from gpudiag.capture.hangdump import install_hang_dump


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def train(
    model: torch.nn.Module,
    steps: int,
    rank: int,
    rec: CollectiveRecorder | None,
    first_step: int = 0,
) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        x = torch.randn(32, 256, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        if rec is not None:
            rec.on_step_end(first_step + i, time.time_ns())
    return times


def mode_record(run: Path, rank: int, steps: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpudiag.capture import ddp

    rec = CollectiveRecorder(run, rank)
    rec.install()
    base = make_model()
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.5)
    plain = DDP(copy.deepcopy(base), bucket_cap_mb=0.5)
    ddp.leave_untouched(plain)  # DDP's own C++ all-reduce, to compare against
    train(hooked, steps, rank, rec)
    step = steps
    train(plain, 3, rank, rec, first_step=step)
    step += 3
    # the same 3 steps with gpudiag's hook must give the same parameters bit for bit
    check = DDP(copy.deepcopy(base), bucket_cap_mb=0.5)
    train(check, 3, rank, rec, first_step=step)
    step += 3
    identical = all(
        torch.equal(a, b) for a, b in zip(check.parameters(), plain.parameters(), strict=True)
    )
    # a user's own comm hook: gpudiag times it through register_comm_hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    user_hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.5)
    user_hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    train(user_hooked, 2, rank, rec, first_step=step)
    step += 2
    world = dist.group.WORLD
    from torch.distributed import all_reduce as imported_all_reduce  # after install

    user = {}
    t = torch.arange(1000, dtype=torch.float32)
    imported_all_reduce(t)
    user["all_reduce"] = world._get_sequence_number_for_group()
    dist.broadcast(torch.zeros(77, dtype=torch.float64), src=0)
    user["broadcast"] = world._get_sequence_number_for_group()
    out = [torch.zeros(33, dtype=torch.int32) for _ in range(2)]
    dist.all_gather(out, torch.ones(33, dtype=torch.int32))
    user["all_gather"] = world._get_sequence_number_for_group()
    work = dist.all_reduce(torch.ones(55), async_op=True)
    work.wait()
    user["async_all_reduce"] = world._get_sequence_number_for_group()
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(44), group=sub)
    user["sub_all_reduce"] = sub._get_sequence_number_for_group()
    rec.on_step_end(step, time.time_ns())
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    # FR dump cost on a full-ish ring, measured here for the report
    t0 = time.perf_counter_ns()
    n = len(dump_flight_recorder())
    fr_dump_ns = time.perf_counter_ns() - t0
    rec.close()
    return {
        "grad_bytes": grad_bytes,
        "steps": steps,
        "identical": identical,
        "user_seq": user,
        "sub_pg_name": dist.distributed_c10d._world.pg_names[sub],
        "world_pg_name": dist.distributed_c10d._world.pg_names[world],
        "summary": rec.summary(),
        "fr_entries": n,
        "fr_full_dump_ns": fr_dump_ns,
    }


def mode_hang(run: Path, rank: int, steps: int) -> dict:
    rec = CollectiveRecorder(run, rank)
    rec.install()
    install_hang_dump(run, rank)
    for i in range(steps):
        dist.all_reduce(torch.ones(64))
        rec.on_step_end(i, time.time_ns())
    if rank == 1:
        time.sleep(120)  # skips the all_reduce the other rank waits in
    else:
        dist.all_reduce(torch.ones(4096))
    return {}


def mode_desync_ops(run: Path, rank: int, steps: int) -> dict:
    rec = CollectiveRecorder(run, rank)
    rec.install()
    install_hang_dump(run, rank)
    for i in range(steps):
        dist.all_reduce(torch.ones(64))
        rec.on_step_end(i, time.time_ns())
    if rank == 0:
        dist.all_reduce(torch.ones(1000))  # rank 1 broadcasts at the same seq: gloo hangs
    else:
        dist.broadcast(torch.ones(1000), src=1)
    return {}


def mode_ring(run: Path, rank: int, steps: int) -> dict:
    """A ring too small for the dump interval: losses must be detected and counted."""
    rec = CollectiveRecorder(run, rank, dump_every=5)
    rec.install()
    issued = 0
    for i in range(steps):
        for _ in range(4):
            dist.all_reduce(torch.ones(8))
            issued += 1
        rec.on_step_end(i, time.time_ns())
    rec.close()
    return {"issued": issued, "summary": rec.summary()}


def mode_size_mismatch(run: Path, rank: int, steps: int) -> dict:
    rec = CollectiveRecorder(run, rank)
    rec.install()
    install_hang_dump(run, rank)
    for i in range(steps):
        dist.all_reduce(torch.ones(64))
        rec.on_step_end(i, time.time_ns())
    result: dict = {"raised": None}
    try:
        dist.all_reduce(torch.ones(1000 if rank == 0 else 10))
    except Exception as exc:  # noqa: BLE001 - recording what gloo does is the point
        result["raised"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    rec.on_step_end(steps, time.time_ns())
    rec.close()
    time.sleep(60 if result["raised"] is None else 0)
    return result


def main() -> None:
    mode, run = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    rank = int(os.environ["RANK"])
    for key, value in worker_env().items():
        os.environ.setdefault(key, value)
    rundir.write_rank_json(run, rank, rundir.RANK_INFO, {"rank": rank, "pid": os.getpid()})
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    code = 0
    try:
        result = {
            "record": mode_record,
            "hang": mode_hang,
            "desync_ops": mode_desync_ops,
            "size_mismatch": mode_size_mismatch,
            "ring": mode_ring,
        }[mode](run, rank, steps)
    except Exception as exc:  # noqa: BLE001
        result, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
    rundir.write_rank_json(run, rank, f"harness_{mode}.json", result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
