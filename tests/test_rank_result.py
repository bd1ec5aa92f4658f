"""The per-rank result: what one rank's task sends back from a Dask worker (or a pool
process) once its events are dropped. It must stay small (issue 12: only per-rank
results travel back), and what was made small must still be exact: the activity sets
the client's all-reduce stall reads, and each timeline lane's busy/idle total.

Real recorded traces from ../shared/traces and the sample runs, read in place.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag import rundir
from gpudiag.analysis import breakdown as bd
from gpudiag.analysis import ingest, pipeline
from gpudiag.analysis import intervals as iv
from gpudiag.analysis import timeline as tl
from gpudiag.paths import sample_runs_dir

# hta_nccl_a100's single A100 rank: 409 kB before (314 kB of timeline intervals,
# 59 kB of activity sets), 34 kB now.
HTA_RANK_BOUND = 48_000
ANY_RANK_BOUND = 64_000  # astrasim's ranks are the largest others: 35 kB


def _result(path: Path) -> ingest.RankTrace:
    trace, _ = ingest.load_task((str(path), ingest.max_trace_bytes(), pipeline.prepare_rank, False))
    assert trace is not None, path
    assert trace.events_dropped and trace.events.empty
    return trace


def _with_events(path: Path) -> ingest.RankTrace:
    trace, _ = ingest.load_task((str(path), ingest.max_trace_bytes(), pipeline.prepare_rank, True))
    assert trace is not None, path
    return trace


def test_hta_a100_rank_result_pickles_small(shared_traces: Path) -> None:
    trace = _result(shared_traces / "hta_nccl_a100" / "nccl_data.json.gz")
    size = len(pickle.dumps(trace))
    assert size <= HTA_RANK_BOUND, size
    # and its 7286 timeline intervals came back merged to the per-rank budget
    lanes = trace.cache["timeline"]
    assert lanes.merged
    assert len(tl.rank_timeline(trace)) <= tl.RANK_BUDGET + len(trace.steps)


@pytest.mark.slow  # reads every trace set (~25 s)
def test_every_rank_result_of_every_trace_set_is_small(shared_traces: Path) -> None:
    sets = [p for p in sorted(shared_traces.iterdir()) if p.is_dir()]
    files = [f for s in sets for f in rundir.find_traces(s)]
    for run in rundir.sample_run_paths(sample_runs_dir()):
        files += list(rundir.load_run(run).trace_files.values())
    assert len(files) >= 20
    sizes = {f: len(pickle.dumps(_result(f))) for f in files}
    worst = max(sizes, key=lambda f: sizes[f])
    assert sizes[worst] <= ANY_RANK_BOUND, (worst, sizes[worst])


def _union_ns(frame: pd.DataFrame) -> int:
    return iv.length(iv.union(frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()))


@pytest.mark.parametrize("budget", [tl.RANK_BUDGET, 40])
def test_bounded_timeline_keeps_every_lane_total_exact(shared_traces: Path, budget: int) -> None:
    trace = _with_events(shared_traces / "hta_nccl_a100" / "nccl_data.json.gz")
    full = tl._lanes_frame(trace)
    assert len(full) > budget  # the bound is exercised
    small = tl.rank_lanes(full, budget).frame()
    steps = small[small["lane"] == "step"]
    assert len(small) - len(steps) <= budget
    assert set(small["lane"]) == set(full["lane"])
    for lane, rows in full.groupby("lane"):
        kept = small[small["lane"] == lane]
        assert _union_ns(kept) == _union_ns(rows), lane  # busy (idle) time to the ns
        assert int((kept["end_ns"] - kept["start_ns"]).sum()) == _union_ns(rows), lane
        assert kept["start_ns"].min() == rows["start_ns"].min(), lane
    # the steps are never merged
    assert steps.reset_index(drop=True).equals(full[full["lane"] == "step"].reset_index(drop=True))


def test_small_timeline_is_kept_as_recorded(shared_traces: Path) -> None:
    """Under the budget nothing is merged: every collective keeps its own name."""
    path = sample_runs_dir() / "ddp4_straggler"
    trace = _with_events(rundir.load_run(path).trace_files[0])
    full = tl._lanes_frame(trace)
    assert len(full) < tl.RANK_BUDGET
    lanes = trace.cache["timeline"]
    assert not lanes.merged
    pd.testing.assert_frame_equal(lanes.frame(), full.reset_index(drop=True), check_dtype=False)


def test_packed_activity_sets_are_exact(shared_traces: Path) -> None:
    trace = _with_events(shared_traces / "tracelens_mi300_ddp" / "resnet_act_checkpoint.json.gz")
    recomputed = bd._activity_sets(trace)
    travelled = pickle.loads(pickle.dumps(bd.activity_sets(trace)))
    for name, (s, e) in recomputed.items():
        assert np.array_equal(travelled[name][0], s), name
        assert np.array_equal(travelled[name][1], e), name
        assert travelled[name][0].dtype == np.int64
