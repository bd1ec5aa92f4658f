"""Data-wait findings on real 2-rank gloo DDP jobs recorded with `gpudiag trace` (issue 29
and 31): a one-off wait for DataLoader workers to start is start-up, not a per-step
cost; a wait on one rank only is reported for that rank, at its own ms per step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.result import AnalysisResult

pytestmark = pytest.mark.slow

SUITE = Path(__file__).parent / "scripts" / "suite_train.py"
JOB_TIMEOUT_S = 240
WORKER_START_S = 3.0
WORKER_STAGGER_S = 0.4

# A DataLoader with num_workers=2 whose workers sleep WORKER_START_S in worker_init_fn
# (torchvision imagenet with `-j 2` waited 5.4 s at step 0, at most 10 ms after), the
# second WORKER_STAGGER_S longer: step 1 waits for it (CI on a loaded host: ~150 ms at
# step 1 made a high 15.2 ms/step stall beside a 1.3 ms table).
SLOW_START = """
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Batches(Dataset):
    def __init__(self, n, width, batch):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, batch, width, generator=g)
        self.y = torch.randn(n, batch, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SlowStart:
    def __init__(self, seconds, stagger):
        self.seconds = seconds
        self.stagger = stagger

    def __call__(self, worker_id):
        # worker 1 starts later, as on a loaded host, so step 1 waits for it too
        time.sleep(self.seconds + worker_id * self.stagger)


def first(items):
    return items[0]


def main():
    steps, start_s, stagger_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    data = Batches(steps * dist.get_world_size(), 128, 64)
    loader = DataLoader(
        data,
        batch_size=1,
        sampler=DistributedSampler(data, shuffle=False),
        collate_fn=first,
        num_workers=2,
        worker_init_fn=SlowStart(start_s, stagger_s),
    )
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def _trace(out: Path, options: list[str], script: Path, args: list[str]) -> AnalysisResult:
    cmd = [sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2", "--standalone"]
    cmd += ["--no-lint", "--out", str(out), *options, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False)
    result = analyze(out)
    # a job that did not finish cleanly is a broken fixture, not a finding to test
    assert result.run.status == "ok", proc.stderr[-2000:]
    return result


@pytest.fixture(scope="module")
def slow_start(tmp_path_factory: pytest.TempPathFactory) -> AnalysisResult:
    root = tmp_path_factory.mktemp("slow_start")
    script = root / "slow_start_train.py"
    script.write_text(SLOW_START)
    return _trace(
        root / "run",
        ["--profile-steps", "3-8"],
        script,
        ["12", str(WORKER_START_S), str(WORKER_STAGGER_S)],
    )


@pytest.fixture(scope="module")
def one_rank_waits(tmp_path_factory: pytest.TempPathFactory) -> AnalysisResult:
    root = tmp_path_factory.mktemp("one_rank_waits")
    args = ["--steps", "12", "--data-ms", "50", "--data-ranks", "1"]
    return _trace(root / "run", ["--profile-steps", "3-8"], SUITE, args)


def test_worker_start_up_is_reported_once_not_per_step(slow_start):
    run = slow_start.dataloader.run
    assert sorted(run) == [0, 1]
    for rank, wait in run.items():
        # steps 0 and 1 waited for the two workers to start; both are set apart
        started = (WORKER_START_S + WORKER_STAGGER_S) * 1e3
        assert wait.startup_ms is not None and wait.startup_ms > 0.8 * started, rank
        assert wait.steps == 10 and wait.data_ms_max_step is not None
        # later steps: a few ms (one a few hundred when the profiler starts on a busy host)
        assert wait.data_ms_max_step < 0.2 * wait.startup_ms, rank
        assert wait.data_ms_per_step < 0.05 * wait.startup_ms
    stalls = [f for f in slow_start.findings if f.kind == "dataloader_stall"]
    # before: "Steps wait 248.5 ms for data" (3 s / 12 steps) beside a table of ~1 ms
    for stall in stalls:
        assert stall.cost_ms_per_step < 50
        assert stall.evidence["startup_ms_per_rank"].keys() == {"0", "1"}
    table = slow_start.ranks.set_index("rank")["data_loading"]
    for stall in stalls:
        assert stall.cost_ms_per_step < 10 * max(float(table.max()), 1.0)


def test_data_wait_on_one_rank_is_that_ranks_own(one_rank_waits):
    stall = next(f for f in one_rank_waits.findings if f.kind == "dataloader_stall")
    per_rank = stall.evidence["per_rank_data_ms"]
    assert per_rank["1"] > 40 and per_rank["0"] < 5  # 50 ms of sleep in rank 1's collate
    # before: the mean over ranks (~25 ms), which matches neither rank
    assert stall.ranks == [1]
    assert stall.cost_ms_per_step == pytest.approx(per_rank["1"], abs=0.01)
    shown = re.match(r"Rank 1 waits ([\d.]+) ms per step for data", stall.title)
    assert shown is not None and float(shown[1]) == pytest.approx(per_rank["1"], abs=0.006)
    assert stall.evidence["rank_specific"] is True
    assert stall.evidence["other_ranks_data_ms"] == pytest.approx(per_rank["0"], abs=0.01)
