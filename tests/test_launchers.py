"""Launchers that start ranks gpudiag did not start itself (issue 29; issue 28 F5, F6).

- Lightning's own DDP launcher (`_SubprocessScriptLauncher`) runs the script again for
  ranks 1..N-1: those processes are followed as ranks of the same run.
- A script started once per rank by hand, each start passing `rank=`/`world_size=` to
  `init_process_group`: each rank is recorded under the rank and world size it got.
- accelerate's notebook_launcher is followed (torch.multiprocessing underneath);
  `accelerate launch` and `torchrun` as the traced target are refused with one line.
- The final line counts the ranks of the run and names those that left nothing.

The jobs are real: gloo process groups, Lightning's and accelerate's own code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.analysis import analyze
from gpudiag.capture.launcher import ranks_line
from gpudiag.capture.worker import reexec_command
from gpudiag.cli.trace import refused_launcher

SCRIPTS = Path(__file__).parent / "scripts" / "launchers"
LIT = SCRIPTS / "lit_ddp.py"
EXPLICIT = SCRIPTS / "explicit_rank.py"
NOTEBOOK = SCRIPTS / "accel_notebook.py"
ACCEL = SCRIPTS / "accel_script.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _trace(
    out: Path,
    script: Path,
    args: list[str],
    options: list[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint"]
    command += ["--hang-timeout", "120", *(options or []), str(script), *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, **(env or {})},
        cwd=cwd or out.parent,
    )


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _final_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.startswith("gpudiag: run ")][-1]


def _needs(module: str) -> None:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{module} is not importable here (pip install 'gpudiag[frameworks]')")


# ----------------------------------------------------------------- Lightning


@pytest.mark.slow
def test_lightning_ddp_launcher_ranks_are_followed(tmp_path: Path) -> None:
    """Trainer(devices=2, strategy="ddp", accelerator="cpu"): before, only rank 0 was
    recorded ("run ok ... 1 rank(s)", world size 1)."""
    _needs("lightning")
    out = tmp_path / "run"
    proc = _trace(out, LIT, ["10", "2", str(tmp_path / "root")])
    assert proc.returncode == 0, proc.stderr
    m = _json(out / "manifest.json")
    assert m["status"] == "ok" and m["world_size"] == 2, proc.stderr
    assert m["traced_ranks"] == [0, 1] and m["untraced_ranks"] == []
    assert m["steps_completed"] == {"0": 10, "1": 10}
    infos = [_json(rundir.rank_dir(out, r) / rundir.RANK_INFO) for r in (0, 1)]
    assert [i["world_size"] for i in infos] == [2, 2]
    assert [i["started_by"] for i in infos] == ["gpudiag", "reexec"]
    assert [i["rank_source"] for i in infos] == ["init_process_group"] * 2
    assert infos[1]["parent_pid"] == infos[0]["pid"]
    assert {i["backend"] for i in infos} == {"gloo"}
    assert all((out / "traces" / f"rank{r}.pt.trace.json.gz").is_file() for r in (0, 1))
    assert "2 rank(s), steps per rank [10]" in _final_line(proc.stderr)


@pytest.mark.slow
def test_lightning_rank0_failure_waits_for_the_followed_rank(tmp_path: Path) -> None:
    """Rank 0 raises: the rank Lightning re-executed still writes its status before the
    launcher decides, and rank 0 is named the cause."""
    _needs("lightning")
    out = tmp_path / "run"
    proc = _trace(out, LIT, ["10", "2", str(tmp_path / "root"), "0"])
    assert proc.returncode == 1, proc.stderr
    m = _json(out / "manifest.json")
    assert m["status"] == "failed" and m["failure"]["rank"] == 0, proc.stderr
    assert "injected failure on rank 0" in m["failure"]["message"]
    assert m["missing_status_ranks"] == [] and m["traced_ranks"] == [0, 1]
    assert _json(rundir.rank_dir(out, 1) / rundir.STATUS)["status"] == "failed"
    assert "wrote no status" not in _final_line(proc.stderr)


@pytest.mark.slow
def test_ctrl_c_to_a_lightning_job_is_an_interrupt_not_a_failure(tmp_path: Path) -> None:
    """Lightning answers a KeyboardInterrupt with sys.exit(1) after SIGKILLing the ranks
    it started: rank 0 is `interrupted` (not a SystemExit failure), the killed rank is
    named on the final line, and gpudiag ends at once, with Lightning's exit code 1 (as
    under plain python)."""
    _needs("lightning")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint"]
    proc = subprocess.Popen(
        [*command, str(LIT), "2000", "2", str(tmp_path / "root")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    steps = rundir.table_path(rundir.rank_dir(out, 1), rundir.STEPS)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if steps.exists() and len(steps.read_text().splitlines()) >= 3:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert time.monotonic() - sent < 60
    m = _json(out / "manifest.json")
    assert m["status"] == "interrupted" and m["failure"] is None, err
    assert m["traced_ranks"] == [0, 1] and m["world_size"] == 2
    status = _json(rundir.rank_dir(out, 0) / rundir.STATUS)
    assert (status["status"], status["exc_type"]) == ("interrupted", "KeyboardInterrupt")
    # the Ctrl-C often lands while rank 0 writes its window's trace: held until written
    assert (out / "traces" / "rank0.pt.trace.json.gz").is_file(), err
    line = _final_line(err)
    if not (rundir.rank_dir(out, 1) / rundir.STATUS).exists():
        assert "rank(s) 1 wrote no status" in line, line


# ----------------------------------------------------------------- rank from init_process_group


@pytest.mark.slow
def test_ranks_started_by_hand_take_rank_and_world_from_init_process_group(
    tmp_path: Path,
) -> None:
    """Two `gpudiag trace explicit_rank.py R` started by hand on one host, each passing
    its rank to init_process_group: before, both were recorded as rank 0 of a world of 1."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    outs = [tmp_path / "a", tmp_path / "b"]
    command = [sys.executable, "-m", "gpudiag", "trace", "--no-lint", "--hang-timeout", "120"]
    procs = [
        subprocess.Popen(
            [*command, "--out", str(out), str(EXPLICIT), str(rank), "2", "8"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for rank, out in enumerate(outs)
    ]
    results = [p.communicate(timeout=400) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
    for rank, (out, (_, err)) in enumerate(zip(outs, results, strict=True)):
        other = 1 - rank
        assert rundir.list_ranks(out) == [rank]
        info = _json(rundir.rank_dir(out, rank) / rundir.RANK_INFO)
        assert (info["rank"], info["world_size"]) == (rank, 2)
        assert info["rank_source"] == "init_process_group"
        assert info["init_method"] == f"tcp://127.0.0.1:{env['MASTER_PORT']}"
        assert _json(rundir.rank_dir(out, rank) / rundir.STATUS)["steps_completed"] == 8
        assert (out / "traces" / f"rank{rank}.pt.trace.json.gz").is_file()
        m = _json(out / "manifest.json")
        assert m["world_size"] == 2 and m["status"] == "ok"
        assert m["traced_ranks"] == [rank] and m["untraced_ranks"] == [other]
        assert m["init_method"] == info["init_method"]
        line = _final_line(err)
        assert f"1 of 2 rank(s) traced; rank(s) {other} left nothing" in line, line
    # `gpudiag analyze A B`: the two directories are the two ranks of one run
    assert rundir.group_node_dirs(outs) == [outs]
    result = analyze(outs)
    assert result.run.world_size == 2 and result.run.ranks_present == [0, 1]
    assert sorted(result.ranks["rank"].astype(int)) == [0, 1]
    assert not [f for f in result.findings if "not recorded" in f.title]
    # one of them alone is half the job: its cross-rank findings say so
    alone = analyze(outs[0])
    for finding in alone.findings:
        if finding.kind in ("straggler", "exposed_communication", "bucket_size"):
            assert "rank 1 of the world of 2 was not recorded" in finding.title
            assert finding.severity == "low"


# ----------------------------------------------------------------- accelerate


@pytest.mark.slow
def test_accelerate_notebook_launcher_is_followed(tmp_path: Path) -> None:
    _needs("accelerate")
    out = tmp_path / "run"
    proc = _trace(out, NOTEBOOK, ["10", str(_free_port())])
    assert proc.returncode == 0, proc.stderr
    m = _json(out / "manifest.json")
    assert m["world_size"] == 2 and m["traced_ranks"] == [0, 1], proc.stderr
    assert m["steps_completed"] == {"0": 10, "1": 10}
    infos = [_json(rundir.rank_dir(out, r) / rundir.RANK_INFO) for r in (0, 1)]
    assert [i["started_by"] for i in infos] == ["spawn", "spawn"]
    # probe 28g, N6: its followed ranks were said to "run untraced", the run "incomplete"
    assert "untraced" not in proc.stderr and "incomplete" not in _final_line(proc.stderr)


@pytest.mark.slow
def test_accelerate_script_traced_as_torchrun_would_start_it(tmp_path: Path) -> None:
    """What the refusal of `accelerate launch` tells the user to run instead."""
    _needs("accelerate")
    out = tmp_path / "run"
    proc = _trace(out, ACCEL, ["10"], options=["--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr
    assert "world 2" in proc.stdout
    m = _json(out / "manifest.json")
    assert m["world_size"] == 2 and m["steps_completed"] == {"0": 10, "1": 10}


def _refused(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list(cwd.glob("gpudiag_runs/*")), "nothing may start"
    return proc


def test_accelerate_launch_and_torchrun_as_the_target_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("print('never run')\n")
    proc = _refused(
        ["-m", "accelerate.commands.launch", "--num_processes", "2", "train.py"], tmp_path
    )
    assert "gpudiag trace --nproc-per-node N script.py" in proc.stderr
    assert "accelerate launch" in proc.stderr
    stub = tmp_path / "accelerate"  # the console script pip writes
    stub.write_text(
        f"#!{sys.executable}\nimport sys\nfrom accelerate.commands.accelerate_cli import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    assert "accelerate launch" in _refused([str(stub), "launch", "train.py"], tmp_path).stderr
    proc = _refused(["-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], tmp_path)
    assert "torchrun" in proc.stderr


def test_refused_launcher_leaves_training_scripts_alone(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from accelerate.commands.accelerate_cli import main\n")
    assert refused_launcher({"script": str(script)}) is None  # a .py file is the user's
    assert refused_launcher({"module": "mypkg.train"}) is None
    assert refused_launcher({"module": "accelerate.commands.launch"}) == "accelerate launch"
    shim = tmp_path / "torchrun"  # pyenv's bash shim
    shim.write_text('#!/usr/bin/env bash\nexec "$(pyenv root)/libexec/pyenv" exec torchrun "$@"\n')
    assert refused_launcher({"script": str(shim)}) == "torchrun"


# ----------------------------------------------------------------- units


def test_reexec_command_matches_only_the_traced_script(tmp_path: Path) -> None:
    script = tmp_path / "lit.py"
    script.write_text("")
    other = tmp_path / "other.py"
    other.write_text("")
    target = {"script": str(script)}
    py = sys.executable
    worker = ["-m", "gpudiag.capture.rank"]
    # Lightning's command: sys.executable, the script's absolute path, its argv
    assert reexec_command([py, str(script), "--x", "1"], target) == [
        py,
        *worker,
        str(script),
        "--x",
        "1",
    ]
    assert reexec_command(["python3", "-u", "-X", "dev", str(script)], target) == [
        "python3",
        "-u",
        "-X",
        "dev",
        *worker,
        str(script),
    ]
    # relative to the Popen's cwd
    assert reexec_command([py, "lit.py"], target, cwd=tmp_path) == [py, *worker, "lit.py"]
    assert reexec_command([py, str(other)], target) is None
    assert reexec_command([py, "-c", "print(1)"], target) is None
    assert reexec_command(f"{py} {script}", target) is None  # a shell string
    assert reexec_command(["bash", str(script)], target) is None
    assert reexec_command([py, *worker, str(script)], target) is None  # already ours
    assert reexec_command([py], target) is None
    module = {"module": "pkg.train"}
    assert reexec_command([py, "-m", "pkg.train", "a"], module) == [
        py,
        *worker,
        "-m",
        "pkg.train",
        "a",
    ]
    assert reexec_command([py, "-m", "pkg.other"], module) is None


def test_final_line_counts_the_ranks_of_the_run() -> None:
    """Issue 28 F6: "N rank(s)" counted only the ranks that wrote a status."""
    full = {
        "world_size": 2,
        "traced_ranks": [0, 1],
        "untraced_ranks": [],
        "steps_completed": {0: 5, 1: 5},
    }
    assert ranks_line(full) == "2 rank(s), steps per rank [5]"
    one = {"world_size": 2, "traced_ranks": [1], "untraced_ranks": [0], "steps_completed": {1: 8}}
    assert ranks_line(one) == (
        "1 of 2 rank(s) traced; rank(s) 0 left nothing (untraced, or started by another "
        "launcher), steps per rank [8]"
    )
    died = {
        "world_size": 4,
        "traced_ranks": [0, 1, 2, 3],
        "untraced_ranks": [],
        "steps_completed": {0: 3, 3: 3},
    }
    assert ranks_line(died) == "4 rank(s); rank(s) 1-2 wrote no status, steps per rank [3]"
    torchrun = {**one, "launch": {"torchrun": True}}  # a rank that died before set-up
    assert (
        ranks_line(torchrun) == "1 of 2 rank(s) traced; rank(s) 0 left nothing, steps per rank [8]"
    )
    old = {"world_size": 1, "steps_completed": {"0": 7}}  # a manifest without traced_ranks
    assert ranks_line(old) == "1 rank(s), steps per rank [7]"
    none = {"world_size": None, "traced_ranks": [], "untraced_ranks": [], "steps_completed": {}}
    assert ranks_line(none) == "0 rank(s), no steps recorded"
    lost = {"world_size": 2, "traced_ranks": [0, 1], "untraced_ranks": [], "steps_completed": {}}
    assert ranks_line(lost) == "2 rank(s); rank(s) 0-1 wrote no status, no steps recorded"


@pytest.mark.slow
def test_script_that_runs_itself_as_a_helper_keeps_one_rank(tmp_path: Path) -> None:
    """A re-executed script that never calls init_process_group is no rank: it runs
    under gpudiag's worker but records nothing, and keeps its own exit code."""
    out = tmp_path / "run"
    marker = tmp_path / "helper.txt"
    proc = _trace(out, SCRIPTS / "self_helper.py", ["train", str(marker)])
    assert proc.returncode == 0, proc.stderr
    assert rundir.list_ranks(out) == [0]
    info = _json(rundir.rank_dir(out, 0) / rundir.RANK_INFO)
    assert marker.read_text() == f"helper ran, re-executed by {info['pid']}\n"
    assert (info["rank"], info["world_size"], info["started_by"]) == (0, 1, "gpudiag")
    assert info["rank_source"] == "default"
    m = _json(out / "manifest.json")
    assert m["steps_completed"] == {"0": 6} and m["traced_ranks"] == [0]
    assert _final_line(proc.stderr).startswith("gpudiag: run ok (exit code 0), 1 rank(s)")
