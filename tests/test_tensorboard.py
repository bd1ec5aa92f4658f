"""A gpudiag run opens in TensorBoard's profiler plugin as it is (the `[tensorboard]`
extra): `tensorboard --logdir RUN` (or a folder of runs) finds each run's traces/ as one
plugin run, one worker per rank, and the plugin parses every trace."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from gpudiag import rundir

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"

tb_io = pytest.importorskip("torch_tb_profiler.io", reason="the [tensorboard] extra")
from torch_tb_profiler import consts, utils  # noqa: E402
from torch_tb_profiler.profiler.data import RunProfileData  # noqa: E402

logging.getLogger("torch_tb_profiler").setLevel(logging.ERROR)


def _plugin_run_dirs(logdir: Path) -> list[Path]:
    """What TorchProfilerPlugin._get_run_dirs yields for ``--logdir logdir``."""
    found = []
    for root, _, files in tb_io.walk(str(logdir)):
        if any(utils.is_chrome_trace_file(f) for f in files):
            found.append(Path(root))
    return sorted(found)


def test_logdir_of_sample_runs_lists_each_runs_traces() -> None:
    runs = [p for p in rundir.sample_run_paths(SAMPLES) if (p / rundir.TRACES_DIR).is_dir()]
    assert len(runs) >= 3
    assert _plugin_run_dirs(SAMPLES) == sorted(p / rundir.TRACES_DIR for p in runs)


@pytest.mark.parametrize("name", ["ddp2_healthy", "ddp4_straggler"])
def test_plugin_parses_every_rank_of_a_run(name: str) -> None:
    run = rundir.load_run(SAMPLES / name)
    assert run.trace_files
    for rank, path in sorted(run.trace_files.items()):
        match = consts.WORKER_PATTERN.match(path.name)
        assert match is not None and match.group(1) == f"rank{rank}"
        profile = RunProfileData.from_json(
            match.group(1), None, json.loads(gzip.decompress(path.read_bytes()))
        )
        profile.process()  # what the plugin's loader runs on each worker's trace
        assert profile.steps_names, (rank, path)
        assert len(profile.steps_names) == len(profile.comm_overlap_costs)
