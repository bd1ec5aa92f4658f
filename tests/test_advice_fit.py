"""Advice fits the evidence: a tiny DDP model, whose all-reduce carries a few hundred
bytes, is latency-bound (recorded here with `gpudiag trace` on gloo): no bucket_size
finding and no bandwidth advice. A model with MB-sized buckets keeps both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analysis import analyze

REPO = Path(__file__).resolve().parents[1]
TRAIN = Path(__file__).parent / "scripts" / "findings_train.py"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    cmd = [
        sys.executable,
        "-m",
        "gpudiag",
        "trace",
        "--nproc-per-node",
        "2",
        "--standalone",
        "--no-lint",
        "--out",
        str(out),
        "--profile-steps",
        "3-9",
        str(TRAIN),
        *("--steps", "12", "--batch", "4", "--width", "8", "--depth", "1"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_tiny_all_reduce_is_latency_bound(tiny_run: Path) -> None:
    res = analyze(tiny_run)
    assert res.run.status == "ok"
    # Linear(8, 8) + Linear(8, 1): 81 float gradients = 324 bytes per all-reduce
    assert res.collectives.frame()["bytes"].max() == 324
    kinds = {f.kind: f for f in res.findings}
    assert "bucket_size" not in kinds
    for f in res.findings:
        assert "bf16" not in f.fix and "FSDP" not in f.fix and "bucket_cap_mb" not in f.fix
    if "exposed_communication" in kinds:  # latency on a loaded host: say what helps
        exposed = kinds["exposed_communication"]
        assert exposed.evidence["latency_bound"] is True
        assert "no_sync" in exposed.fix


def test_megabyte_buckets_keep_bandwidth_advice() -> None:
    res = analyze(REPO / "sample_runs" / "ddp4_straggler")
    assert res.collectives.frame()["bytes"].max() > 1e6
    exposed = {f.kind: f for f in res.findings}["exposed_communication"]
    assert "latency_bound" not in exposed.evidence
    assert "bf16" in exposed.fix
