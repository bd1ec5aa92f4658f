"""A collective that times out (the script's own ``timeout=``): the rank that never
reached it is the cause, not the rank whose wait timed out (issue 28: before, the
manifest and `gpudiag analyze` blamed rank 0's "Timed out waiting 3000ms" and called
the late rank a consequence). Real gloo jobs under `gpudiag trace`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analysis import analyze

SCRIPT = Path(__file__).parent / "scripts" / "collective_timeout_job.py"
LATE_LINE = next(
    i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "LATE HERE" in line
)

pytestmark = pytest.mark.slow


def _gpudiag_trace(run: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`gpudiag trace --out RUN --no-lint ARGS`, waited for."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(run), "--no-lint", *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _trace(
    tmp_path: Path, nproc: int, late_rank: int, op: str
) -> tuple[subprocess.CompletedProcess, dict]:
    run = tmp_path / "run"
    proc = _gpudiag_trace(
        run,
        [
            "--nproc-per-node",
            str(nproc),
            str(SCRIPT),
            "--late-rank",
            str(late_rank),
            "--op",
            op,
            *(["--late-at", "0"] if op == "subgroup" else []),
        ],
    )
    return proc, json.loads((run / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("nproc", "late_rank", "op"),
    [
        (2, 1, "all_reduce"),
        (3, 0, "all_reduce"),
        (2, 1, "monitored_barrier"),
        (3, 2, "subgroup"),  # eighth probe, F1: late to a subgroup's first call
    ],
)
def test_the_rank_that_never_arrived_is_the_cause(
    tmp_path: Path, nproc: int, late_rank: int, op: str
) -> None:
    """monitored_barrier names the late rank itself (the seventh probe, F1: the rank
    that detected it was blamed); gloo's all_reduce does not: each rank's last call."""
    proc, manifest = _trace(tmp_path, nproc, late_rank, op)
    assert proc.returncode == 1, proc.stderr[-2000:]  # what torchrun gives: a worker's 1
    assert manifest["status"] == "failed"
    failure = manifest["failure"]
    assert failure["rank"] == late_rank, failure
    assert failure["exc_type"] == "late_to_collective"
    assert failure["waiting_rank"] != late_rank
    assert failure["collective"]["op"] == ("all_reduce" if op == "subgroup" else op)
    assert f"{SCRIPT.name}:" in str(failure["collective"]["callsite"])
    # where the late rank was: the line it spent its time on
    assert f"{SCRIPT.name}:{LATE_LINE}" in failure["message"], failure["message"]
    assert "timed out waiting for it" in failure["message"]
    consequences = {c["rank"] for c in failure["consequences"]}
    assert failure["waiting_rank"] in consequences
    # its traceback is the user's, as python would print it: no gpudiag frames
    assert "gpudiag" not in failure["traceback"] and "SIGTERM" in failure["traceback"]
    first = analyze(tmp_path / "run").findings[0]
    assert first.kind == "rank_failed" and first.ranks[0] == late_rank, first.title


def test_a_deadlock_across_process_groups_names_both_ranks(tmp_path: Path) -> None:
    """Eighth probe, F2: rank 1 waits for rank 2 in a subgroup's call that rank 2 skipped
    (it went on to the barrier, where rank 0 waits too). The hang verdict said "rank 1
    never entered barrier", the rank that was itself waiting. It names the cycle: both
    ranks, both calls, both lines."""
    script = SCRIPT.parent / "cross_group_deadlock.py"
    lines = script.read_text().splitlines()
    extra = next(i for i, t in enumerate(lines, 1) if "ONE MORE HERE" in t)
    barrier = next(i for i, t in enumerate(lines, 1) if "BARRIER HERE" in t)
    run = tmp_path / "run"
    proc = _gpudiag_trace(run, ["--hang-timeout", "8", "--nproc-per-node", "3", str(script)])
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "hang", proc.stderr[-2000:]
    verdict = json.loads((run / "hang_report.json").read_text())["verdict"]
    assert verdict.startswith("deadlock across process groups: rank 1 waits in all_reduce")
    assert "for rank 2" in verdict and "for rank 1" in verdict, verdict
    assert f"{script.name}:{extra}" in verdict and f"{script.name}:{barrier}" in verdict
    first = analyze(run).findings[0]
    assert first.kind == "hang" and "deadlock across process groups" in first.title


@pytest.mark.parametrize("fail", [False, True])
def test_rooted_collectives_are_no_desync(tmp_path: Path, fail: bool) -> None:
    """Ninth probe, F3: a correct `dist.scatter` (the root passes the list, the others 0 B)
    was a HIGH desync on a healthy job, and in a failed one it came first and hid the
    rank's own error (every `dcp.save` uses scatter_object_list). Rooted ops and
    all-to-all are compared by op only."""
    script = SCRIPT.parent / "rooted_collectives_job.py"
    run = tmp_path / "run"
    proc = _gpudiag_trace(
        run, ["--nproc-per-node", "2", str(script), *(["--fail"] if fail else [])]
    )
    assert proc.returncode == (1 if fail else 0), proc.stderr[-2000:]
    findings = analyze(run).findings
    assert not [f for f in findings if f.kind == "desync"], [f.title for f in findings]
    if fail:
        first = findings[0]
        assert first.kind == "rank_failed" and first.ranks == [1], first.title
        assert "the real cause, on rank 1" in first.title


def test_a_chain_of_waits_blames_the_rank_at_its_end(tmp_path: Path) -> None:
    """Ninth probe, F1: rank 0 timed out in group A waiting for rank 1, which was waiting
    in group B for rank 2, slow in its own code. The middle rank was blamed; the blame
    follows the late rank's own pending call to the rank behind it."""
    script = SCRIPT.parent / "chain_of_waits_job.py"
    slow = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if "SLOW HERE" in t)
    run = tmp_path / "run"
    proc = _gpudiag_trace(run, ["--nproc-per-node", "3", str(script), "--timeout-s", "3"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    failure = json.loads((run / "manifest.json").read_text())["failure"]
    assert failure["rank"] == 2 and failure["exc_type"] == "late_to_collective", failure
    assert failure["waiting_rank"] == 1
    assert f"{script.name}:{slow}" in failure["message"], failure["message"]
    assert "rank 0 timed out waiting for rank 1" in failure["message"]
    assert analyze(run).findings[0].ranks[0] == 2


def test_a_hung_chain_of_waits_names_the_rank_at_its_end(tmp_path: Path) -> None:
    """Ninth probe, F1b: the same chain as a hang (no timeouts): the verdict said "rank 1
    never entered ... rank 1 is at <its wait>". It names rank 2 and its line, and the
    wait it keeps up."""
    script = SCRIPT.parent / "chain_of_waits_job.py"
    slow = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if "SLOW HERE" in t)
    run = tmp_path / "run"
    proc = _gpudiag_trace(
        run, ["--hang-timeout", "5", "--on-hang", "end", "--nproc-per-node", "3", str(script)]
    )
    assert json.loads((run / "manifest.json").read_text())["status"] == "hang", proc.stderr
    verdict = json.loads((run / "hang_report.json").read_text())["verdict"]
    assert verdict.startswith("rank 2 never entered all_reduce"), verdict
    assert "that rank 1 is waiting in (which keeps rank 0 waiting in" in verdict
    assert f"{script.name}:{slow}" in verdict
    first = analyze(run).findings[0]
    assert first.kind == "hang" and "rank 2 never entered" in first.title


@pytest.mark.parametrize("where", ["backward", "init"])
def test_a_rank_late_to_a_collective_torch_issues_is_the_cause(tmp_path: Path, where: str) -> None:
    """Probe 28g, N5: rank 0 timed out in a collective torch issued itself (DDP's
    gradient bucket all_reduce inside backward; DDP's start-up sync of the parameters),
    not one the script called, so no rank's last_call.json had it, and the waiting rank
    was blamed. The ranks' Flight Recorder rows hold the call rank 0 waited in and show
    that rank 1 never issued it: rank 1 is the cause, with the line it was late at."""
    script = SCRIPT.parent / "ddp_late_timeout_job.py"
    marker = f"LATE HERE ({where})"
    late = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if marker in t)
    run = tmp_path / "run"
    # no profiler: nothing slow at the first steps that a loaded host could stretch
    # past the 4 s timeout before rank 1 is late on purpose
    args = ["--no-profile", "--nproc-per-node", "2", str(script), "--where", where]
    proc = _gpudiag_trace(run, [*args, "--timeout-s", "4"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    failure = json.loads((run / "manifest.json").read_text())["failure"]
    assert failure["rank"] == 1 and failure["exc_type"] == "late_to_collective", failure
    assert failure["waiting_rank"] == 0
    call = failure["collective"]
    assert call["issued_by"] == "torch" and call["pg_name"] == "0", call
    # DDP's start-up sync: the parameter shapes' all_gather, then the broadcast
    assert call["op"] in (("all_reduce",) if where == "backward" else ("all_gather", "broadcast"))
    assert f"{script.name}:{late}" in failure["message"], failure["message"]
    assert "rank 0 timed out waiting for it" in failure["message"]
    assert 0 in {c["rank"] for c in failure["consequences"]}
    # the launcher's last line names the cause too
    last_line = proc.stderr.strip().splitlines()[-1]
    assert "rank 1 failed: late_to_collective: " in last_line, proc.stderr[-600:]
    first = analyze(run).findings[0]
    assert first.kind == "rank_failed" and first.ranks[0] == 1, first.title
