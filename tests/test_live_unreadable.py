"""Issue 28 (independent probe, U1): `gpudiag watch RUN --once` skipped a rank's files it
could not read (permission 000, a directory or a FIFO in a file's place, truncated or
garbage JSON) without a word. Now each is one `gpudiag: warning: <file>: ...` line on
stderr, the snapshot's `warnings` carry the same lines, and the rest is still shown;
`gpudiag analyze` on the same run says the same in one line and exits 2. And a manifest
whose launcher pid no kernel gives ("123", 1e300) is not a running run.

Every case damages a copy of one real 2-rank gloo DDP run recorded by `gpudiag trace`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fuzz_inputs import can_deny, remove_tree, unprivileged

from gpudiag import rundir

pytestmark = pytest.mark.slow  # records a gloo job, runs the CLI in subprocesses

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "capture_ddp_mlp.py"
STEPS = 8


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("live_unreadable") / "run"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2", "--standalone",
        "--no-lint", "--no-profile", "--out", str(out), str(SCRIPT), "--steps", str(STEPS),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / rundir.MANIFEST).read_text())["status"] == "ok"
    return out


def _cli(*args: str, deny: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = unprivileged() if deny else []
    return subprocess.run(
        [*prefix, sys.executable, "-m", "gpudiag", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("gpudiag: warning: ")]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot json at all{{{")


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("{}")


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _no_permission(path: Path) -> None:
    path.chmod(0)


def _bad_middle_line(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(3, "{this is not json\n")
    path.write_text("".join(lines))


def _status_not_text(path: Path) -> None:
    """`"status": 5` (probe 28c: `watch --once` ended in a TypeError traceback)."""
    doc = json.loads(path.read_text())
    doc["status"] = 5
    path.write_text(json.dumps(doc))


# (file under the run, how it is damaged, what the warning says, needs a denied read)
CASES: dict[str, tuple[str, Callable[[Path], None], str, bool]] = {
    "steps-no-permission": ("rank1/steps.jsonl", _no_permission, "Permission denied", True),
    "steps-directory": ("rank1/steps.jsonl", _directory, "a directory, not a regular file", False),
    "steps-fifo": ("rank1/steps.jsonl", _fifo, "a FIFO, not a regular file", False),
    "steps-bad-line": ("rank1/steps.jsonl", _bad_middle_line, "1 malformed line", False),
    "status-no-permission": ("rank1/status.json", _no_permission, "Permission denied", True),
    "status-directory": ("rank1/status.json", _directory, "a directory, not a regular file", False),
    "status-truncated": ("rank1/status.json", _truncate, "not valid JSON", False),
    "status-garbage": ("rank1/status.json", _garbage, "not valid JSON", False),
    "status-fifo": ("rank1/status.json", _fifo, "a FIFO, not a regular file", False),
    "status-not-text": ("rank1/status.json", _status_not_text, "'status' must be a string", False),
    "rank-info-garbage": ("rank1/rank_info.json", _garbage, "not valid JSON", False),
    "rank-dir-no-permission": ("rank1", _no_permission, "Permission denied", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_watch_names_each_unreadable_file_and_shows_the_rest(
    recorded: Path, tmp_path: Path, case: str
) -> None:
    name, damage, said, deny = CASES[case]
    if deny and not can_deny():
        pytest.skip("cannot make a file unreadable here (root with CAP_DAC_OVERRIDE)")
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    target = run / name
    damage(target)
    try:
        watch = _cli("watch", str(run), "--once", "--json", deny=deny)
        text = _cli("watch", str(run), "--once", deny=deny)
        analyze = _cli("analyze", str(run), "--json", deny=deny)
    finally:
        remove_tree(run)
    for proc in (watch, text):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = _warnings(proc.stderr)  # one line, naming the file and what was wrong
        assert line.startswith(f"gpudiag: warning: {target}: ") and said in line, line
    snap = json.loads(watch.stdout)
    assert snap["warnings"] == [_warnings(watch.stderr)[0].removeprefix("gpudiag: warning: ")]
    ranks = {r["rank"]: r for r in snap["ranks"]}
    assert ranks[0]["step"] == STEPS - 1 and ranks[0]["status"] == "ok", snap  # the rest
    if "steps" in case and case != "steps-bad-line":
        assert 1 in ranks and ranks[1]["step"] is None  # its steps could not be read
    elif "status" in case:
        assert ranks[1]["step"] == STEPS - 1 and ranks[1]["status"] is None
    elif case != "rank-dir-no-permission":
        assert ranks[1]["step"] == STEPS - 1
    assert snap["state"] == "ok"  # the manifest says so
    # `gpudiag analyze` reads the same files: one line naming it, the rest analysed, exit 2
    assert analyze.returncode == 2 and "Traceback" not in analyze.stderr, analyze.stderr
    named = [w for w in _warnings(analyze.stderr) if str(target) in w]
    assert named, analyze.stderr
    assert 0 in {r["rank"] for r in json.loads(analyze.stdout)["ranks"]}, analyze.stdout


@pytest.mark.parametrize("pid", ["1234", 1e300, 2**70, -5, 0, True, None])
def test_a_launcher_pid_no_kernel_gives_is_not_running(
    recorded: Path, tmp_path: Path, pid: object
) -> None:
    """A run marked running whose launcher pid is a string, a float (1e300), out of the
    kernel's range, not positive, a bool or missing was read as `running` (forever, while
    the manifest was fresh): now `launcher_lost`, with one line naming the manifest."""
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    path = run / rundir.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["status"] = "running"
    launcher = dict(manifest["launcher"])
    if pid is None:
        launcher.pop("pid")
    else:
        launcher["pid"] = pid
    manifest["launcher"] = launcher
    path.write_text(json.dumps(manifest))  # fresh: a heartbeat alone would say alive
    assert rundir.run_status(manifest, path) == "launcher_lost"
    watch = _cli("watch", str(run), "--once", "--json")
    assert watch.returncode == 0 and "Traceback" not in watch.stderr, watch.stderr
    assert json.loads(watch.stdout)["state"] == "launcher_lost"
    (line,) = _warnings(watch.stderr)
    assert line.startswith(f"gpudiag: warning: {path}: launcher") and "not running" in line, line
    loaded = rundir.load_run(run)
    assert loaded.manifest["status"] == "launcher_lost"
    assert any(str(path) in w and "launcher_lost" in w for w in loaded.warnings), loaded.warnings
    assert rundir.node_run_statuses(run) == {0: "launcher_lost"}  # the dashboard's list
