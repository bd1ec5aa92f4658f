"""The reference trainers train, and DDP is correct: 2 ranks end where 1 device does.

The two multi-process runs (torchrun and torch.multiprocessing.spawn) are recorded once
per session and asserted on several times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpudiag.reference import train as reference
from gpudiag.reference.train import free_port

# Launches training processes (gloo jobs or CLI runs): CI runs it, `pytest -q` skips it.
pytestmark = pytest.mark.slow

TIMEOUT_S = 180


def _run(args: list[str], timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"  # as torchrun does; also keeps the shared CI cores sane
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """In-process training with one thread, like each DDP rank (and cheaper on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _reports(report_dir: Path) -> dict[int, dict]:
    return {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text())
        for p in sorted(report_dir.glob("rank*.json"))
    }


def _single(tmp: Path, name: str, *argv: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Single-device training in this process (the reference DDP is compared with)."""
    out = tmp / name
    code = reference.main(
        [*argv, "--report-dir", str(out), "--save-params", str(out / "params.pt"), "--quiet"]
    )
    assert code == 0
    return _reports(out)[0], torch.load(out / "params.pt", weights_only=True)


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="session")
def torchrun_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2-rank DDP under torchrun: mlp, small buckets (several all-reduces per step)."""
    out = tmp_path_factory.mktemp("torchrun_ddp")
    argv = ["--model", "mlp", "--steps", "30", "--batch-size", "16", "--seed", "3"]
    proc = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "gpudiag.reference",
            "--mode",
            "ddp",
            *argv,
            "--bucket-cap-mb",
            "0.5",
            "--report-dir",
            str(out),
            "--save-params",
            str(out / "params.pt"),
        ]
    )
    return {"proc": proc, "out": out, "argv": argv}


@pytest.fixture(scope="session")
def spawn_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2-rank DDP through torch.multiprocessing.spawn, as in the article: the toy model,
    two epochs (so DistributedSampler.set_epoch reshuffles), one DataLoader worker."""
    out = tmp_path_factory.mktemp("spawn_ddp")
    argv = ["--model", "toy", "--epochs", "2", "--dataset-size", "320", "--batch-size", "20"]
    proc = _run(
        [
            sys.executable,
            "-m",
            "gpudiag.reference",
            "--mode",
            "ddp",
            "--spawn",
            "2",
            *argv,
            "--num-workers",
            "1",
            "--report-dir",
            str(out),
            "--save-params",
            str(out / "params.pt"),
        ]
    )
    return {"proc": proc, "out": out, "argv": argv}


@pytest.mark.parametrize("fixture", ["torchrun_ddp", "spawn_ddp"])
def test_ddp_trains_and_matches_single_device(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run = request.getfixturevalue(fixture)
    proc = run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(run["out"])
    assert sorted(reports) == [0, 1]
    for rank, rep in reports.items():
        assert rep["mode"] == "ddp" and rep["world_size"] == 2 and rep["rank"] == rank
        assert rep["final_loss"] < 0.9 * rep["initial_loss"], rep
        assert rep["ddp_logging"]["avg_backward_comm_time"] > 0
    # both ranks hold one model: the same held-out loss to the last bit
    assert reports[0]["final_loss"] == reports[1]["final_loss"]
    ddp_params = torch.load(run["out"] / "params.pt", weights_only=True)

    # single device, global batch = 2 x per-rank batch, same seed: the same parameters
    argv = list(run["argv"])
    i = argv.index("--batch-size")
    argv[i + 1] = str(2 * int(argv[i + 1]))
    single_report, single_params = _single(tmp_path, "single", *argv)
    assert single_report["steps"] == reports[0]["steps"]
    assert single_report["global_batch"] == reports[0]["global_batch"]
    _assert_same_params(ddp_params, single_params)
    assert single_report["final_loss"] == pytest.approx(reports[0]["final_loss"], rel=1e-4)

    # and training really moved them: not the initial weights
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
    initial = reference.build_model(argv[argv.index("--model") + 1], seed).state_dict()
    assert any(not torch.allclose(initial[k], single_params[k]) for k in initial)


def test_spawn_ddp_epochs_and_output(spawn_ddp: dict) -> None:
    proc = spawn_ddp["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(spawn_ddp["out"])
    # 320 samples / 2 ranks / 20 per rank = 8 steps per epoch, 2 epochs
    assert reports[0]["steps"] == 16
    assert "step   15" in proc.stdout
    assert "final_loss=" in proc.stdout


def test_ddp_with_a_different_seed_differs(torchrun_ddp: dict, tmp_path: Path) -> None:
    """Guards the equivalence test against comparing two things that never move."""
    argv = list(torchrun_ddp["argv"])
    argv[argv.index("--seed") + 1] = "4"
    argv[argv.index("--batch-size") + 1] = "32"
    _, other = _single(tmp_path, "other_seed", *argv)
    ddp_params = torch.load(torchrun_ddp["out"] / "params.pt", weights_only=True)
    assert not torch.allclose(other["net.0.weight"], ddp_params["net.0.weight"])


@pytest.mark.parametrize("model", ["toy", "mlp", "transformer"])
def test_single_device_learns_every_workload(model: str, tmp_path: Path) -> None:
    report, _ = _single(tmp_path, model, "--model", model, "--steps", "40")
    assert report["steps"] == 40
    assert report["final_loss"] < 0.7 * report["initial_loss"], report
    assert len(report["step_records"]) == 40
    assert report["peak_memory_bytes"] > 0


def test_amp_on_cpu_uses_bf16_and_learns(tmp_path: Path) -> None:
    report, _ = _single(tmp_path, "amp", "--model", "toy", "--steps", "40", "--amp")
    assert report["amp"] is True
    assert report["final_loss"] < 0.7 * report["initial_loss"]


def test_epochs_count_full_batches(tmp_path: Path) -> None:
    report, _ = _single(
        tmp_path, "epochs", "--epochs", "3", "--dataset-size", "100", "--batch-size", "32"
    )
    assert report["steps"] == 9  # 3 full batches of 32 in 100 samples, 3 epochs


def test_injected_slow_forward_and_slow_data(tmp_path: Path) -> None:
    """Sleeps are lower bounds on every step, whatever else loads the machine."""
    slow, _ = _single(tmp_path, "slow", "--steps", "4", "--slow-rank", "0", "--slow-ms", "30")
    data, _ = _single(tmp_path, "data", "--steps", "4", "--slow-data-ms", "25", "--host-sync")
    assert min(r["step_ms"] for r in slow["step_records"]) >= 30
    assert min(r["data_ms"] for r in data["step_records"]) >= 25
    assert min(r["step_ms"] for r in data["step_records"]) >= 25


def test_only_the_named_rank_is_slowed() -> None:
    args = reference.parse_args(["--slow-rank", "2", "--slow-ms", "40"])
    assert [reference.slow_forward_s(args, r) for r in range(4)] == [0.0, 0.0, 0.04, 0.0]
    assert reference.slow_forward_s(reference.parse_args([]), 0) == 0.0


def test_dataparallel_without_cuda_refuses_clearly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: DataParallel runs here")
    assert reference.main(["--mode", "dp", "--steps", "2", "--report-dir", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "--mode dp needs CUDA devices" in out.err and len(out.err.strip().splitlines()) == 1
    assert out.out == ""
    assert not list(tmp_path.iterdir())  # nothing trained, nothing reported


def test_dataparallel_cpu_fallback_says_it_is_single_device(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: DataParallel runs here")
    argv = ["--mode", "dp", "--allow-cpu-fallback", "--steps", "3", "--quiet"]
    assert reference.main([*argv, "--report-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "SINGLE-DEVICE" in err and "not DP numbers" in err
    assert _reports(tmp_path)[0]["mode"] == "single"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="DataParallel needs CUDA")
def test_dataparallel_trains_on_cuda(tmp_path: Path) -> None:
    report, _ = _single(tmp_path, "dp", "--mode", "dp", "--model", "mlp", "--steps", "30")
    assert report["mode"] == "dp"
    assert report["final_loss"] < 0.9 * report["initial_loss"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "ddp"], "--mode ddp needs a launcher"),
        (["--spawn", "2"], "--spawn only applies to --mode ddp"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--batch-size", "64", "--dataset-size", "10"], "larger than --dataset-size"),
    ],
)
def test_bad_configurations_exit_2_with_one_line(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert reference.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
