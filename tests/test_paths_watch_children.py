"""Issue 28, independent probe F7, F11, F12, on real 2-rank gloo jobs:

- F7: a run directory (``--out``) or a script argument that is not UTF-8 (Linux paths
  and arguments are bytes; Python holds the odd bytes as lone surrogates). The profiler
  trace was lost (torch's export refused the path), and `gpudiag analyze` exited 2 on
  its own manifest. Now every run file holds such a byte as ``\\xNN``, the manifest
  keeps the command's exact bytes in ``command_hex``, and the trace is written.
- F11: rank 0 works in a subprocess (a checkpoint upload tool) while rank 1 waits in a
  barrier: the watchdog counted only the rank's own CPU and ended the job as hung. A
  rank's descendants' CPU is its own now. A rank asleep in ``time.sleep`` is still a hang
  (docs/reliability.md: the same as the watchdog's canonical hang).
- F12: `gpudiag watch` on a run whose directory is deleted while watched ended with
  ``state: ok``; now ``gone``, one line naming the directory, exit 2 (and the dashboard's
  live reader says ``gone`` too).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

from gpudiag import rundir  # noqa: E402
from gpudiag.analysis import analyze  # noqa: E402

pytestmark = pytest.mark.slow  # launches 2-rank gloo jobs

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
SUBWORK = SCRIPTS / "subwork_job.py"
LIVE = SCRIPTS / "live_job.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _trace(
    out: str | bytes,
    *args: str | bytes,
    profile: bool = False,
    hang: float = 3,
    on_hang: str = "auto",
):
    cmd: list[str | bytes] = [
        sys.executable, "-m", "gpudiag", "trace", "--out", out, "--no-lint",
        "--hang-timeout", str(hang), "--on-hang", on_hang, "--nproc-per-node", "2",
        "--master-port", str(coll_launch.free_port()),
    ]  # fmt: skip
    if not profile:
        cmd.append("--no-profile")
    return subprocess.run([*cmd, *args], capture_output=True, timeout=400, env=ENV)


def _manifest(out: Path) -> dict:
    return json.loads((out / rundir.MANIFEST).read_bytes())


# --------------------------------------------------------------------------- F7


def test_out_and_argument_that_are_not_utf8_keep_the_trace_and_read_back(tmp_path: Path) -> None:
    out = os.fsencode(tmp_path) + b"/run\xff\xfe"
    proc = _trace(out, str(SUBWORK), "none", "1", b"arg\xff", profile=True)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, stderr[-3000:]
    assert "profiler trace not written" not in stderr + proc.stdout.decode("utf-8", "replace")
    run = Path(os.fsdecode(out))
    for rank in (0, 1):
        assert rundir.trace_path(run, rank).is_file(), stderr[-3000:]
    # every run file is valid UTF-8 and holds the odd bytes as \xNN
    for path in run.rglob("*.json"):
        path.read_bytes().decode("utf-8")  # raises when not UTF-8
        assert "\\ud" not in path.read_text(), path  # no lone surrogate escape
    m = _manifest(run)
    assert m["argv"] == ["none", "1", "arg\\xff"]
    assert m["command"][m["command"].index("--out") + 1].endswith("/run\\xff\\xfe")
    assert [bytes.fromhex(h) for h in m["command_hex"]][-1] == b"arg\xff"  # lossless
    assert bytes.fromhex(m["command_hex"][m["command"].index("--out") + 1]) == out
    # the readers accept what the writer wrote: no warning, exit 0
    analyzed = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", out, "--json"],
        capture_output=True,
        timeout=300,
        env={**ENV, "PYTHONIOENCODING": "utf-8:strict"},
    )
    assert analyzed.returncode == 0, analyzed.stderr.decode("utf-8", "replace")
    assert b"warning" not in analyzed.stderr, analyzed.stderr
    loaded = rundir.load_run(run)
    assert not [w for w in loaded.warnings if "surrogate" in w], loaded.warnings


# --------------------------------------------------------------------------- F11


@pytest.mark.parametrize("mode", ["child", "grandchild"])
def test_rank_working_in_a_subprocess_is_not_a_hang(tmp_path: Path, mode: str) -> None:
    """Rank 0 runs an 8 s CPU-busy subprocess (a grandchild through sh) while rank 1
    waits in a barrier, under --hang-timeout 3: said once, never ended."""
    out = tmp_path / "run"
    proc = _trace(str(out), str(SUBWORK), mode, "8")
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, stderr[-3000:]
    m = _manifest(out)
    assert m["status"] == "ok", stderr[-3000:]
    assert m["steps_completed"] == {"0": 10, "1": 10}, stderr[-3000:]
    assert not (out / rundir.HANG_REPORT).exists(), stderr[-3000:]
    # the notice, when a check saw rank 1 waiting (a loaded machine may not get there)
    notices = [ln for ln in stderr.splitlines() if "still working" in ln]
    assert all(re.search(r"rank 0 has \d subprocess", ln) for ln in notices), stderr[-3000:]


def test_rank_asleep_while_its_peer_waits_is_reported_and_left_running(tmp_path: Path) -> None:
    """Probe 28f: rank 0 asleep longer than --hang-timeout before a barrier (a download, a
    lock, a deliberate wait) while rank 1 waits in it. torchrun lets it finish; gpudiag
    ended it as `hang` (rc 1). Now the suspected hang is said, with its stacks, the job
    goes on, and the report goes once progress resumes."""
    out = tmp_path / "run"
    proc = _trace(str(out), str(SUBWORK), "sleep", "9")
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, stderr[-3000:]
    m = _manifest(out)
    assert m["status"] == "ok" and m["steps_completed"] == {"0": 10, "1": 10}, stderr[-3000:]
    assert not (out / rundir.HANG_REPORT).exists(), stderr[-3000:]
    suspected = [ln for ln in stderr.splitlines() if "hang suspected" in ln]
    assert len(suspected) == 1 and "rank 0 idle outside a collective" in suspected[0], stderr
    assert "progress resumed: not a hang" in stderr
    assert not [f for f in analyze(out).findings if f.kind in ("hang", "desync")]


def test_rank_asleep_while_its_peer_waits_is_a_hang_under_on_hang_end(tmp_path: Path) -> None:
    """The same sleep under `--on-hang end`: what a hang looks like (no CPU, no I/O, no
    subprocess at work, a peer waiting), and the job is ended."""
    out = tmp_path / "run"
    proc = _trace(str(out), str(SUBWORK), "sleep", "30", on_hang="end")
    assert _manifest(out)["status"] == "hang", proc.stderr.decode("utf-8", "replace")[-3000:]
    report = json.loads((out / rundir.HANG_REPORT).read_bytes())
    assert report["ranks"]["0"]["activity"] == "idle"
    assert report["verdict"].startswith("rank 0 never entered barrier")


# --------------------------------------------------------------------------- F12


def test_watch_of_a_run_deleted_while_watched_says_gone(tmp_path: Path) -> None:
    from gpudiag.analysis.live_snapshot import LiveMonitor

    run, stop = tmp_path / "run", tmp_path / "stop"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--nproc-per-node", "2",
        "--standalone", "--no-lint", "--no-profile", "--hang-timeout", "600",
        "--out", str(run), str(LIVE), "slow", str(stop),
    ]  # fmt: skip
    job = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    watch = None
    try:
        deadline = time.monotonic() + 240
        while not (rundir.rank_dir(run, 1) / "steps.jsonl").is_file():
            assert job.poll() is None and time.monotonic() < deadline, "the job never stepped"
            time.sleep(0.5)
        monitor = LiveMonitor(run)  # the dashboard's live reader
        assert monitor.refresh().snapshot.state == "running"
        watch = subprocess.Popen(
            [sys.executable, "-m", "gpudiag", "watch", str(run), "--json", "--interval", "0.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        assert first["state"] == "running", first
        moved = tmp_path / "deleted"
        run.rename(moved)  # `rm -rf run` as the path sees it (ranks write meanwhile)
        shutil.rmtree(moved, ignore_errors=True)
        out, err = watch.communicate(timeout=60)
        last = json.loads(out.strip().splitlines()[-1])
        assert watch.returncode == 2, err
        assert last["state"] == "gone", last
        said = f"gpudiag: warning: {run}: the run directory is gone ("
        lines = [ln for ln in err.splitlines() if "the run directory" in ln]
        assert len(lines) == 1 and lines[0].startswith(said), err
        assert last["warnings"] == [lines[0].removeprefix("gpudiag: warning: ")]
        update = monitor.refresh()
        assert update.snapshot.state == "gone" and not update.still_written
        assert [w.split(" (")[0] for w in update.snapshot.warnings] == [
            f"{run}: the run directory is gone"
        ]
    finally:
        stop.write_text("stop")
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def test_live_reader_says_gone_for_a_directory_replaced_or_removed(tmp_path: Path) -> None:
    """No job needed: the reader's own rule. A directory removed and created again at
    the same path (a rank's writer recreating it, a new run) is not the run watched."""
    run = tmp_path / "run"
    run.mkdir()
    reader = rundir.LiveReader(run)
    assert reader.poll().status is None  # nothing written yet: not gone
    run.rename(tmp_path / "old")  # kept, so the new directory cannot reuse its inode
    run.mkdir()
    batch = reader.poll()
    assert batch.status == "gone" and not batch.writing
    assert batch.warnings == [
        f"{run}: the run directory is gone (replaced by another directory while watched)"
    ]
    run.rmdir()
    run.write_text("")
    assert reader.poll().warnings == [
        f"{run}: the run directory is gone (replaced by a file while watched)"
    ]
    run.unlink()
    assert reader.poll().warnings == [
        f"{run}: the run directory is gone (deleted or moved while watched)"
    ]
    # one job's node directories: gone only when every one is
    alive = tmp_path / "node1"
    alive.mkdir()
    merged = rundir.merge_live_batches([reader.poll(), rundir.LiveReader(alive).poll()])
    assert merged.status is None and len(merged.warnings) == 1
    assert rundir.merge_live_batches([reader.poll()]).status == "gone"


def test_sigterm_while_a_hang_is_suspected_is_no_progress(tmp_path: Path) -> None:
    """Probe 28i, M2: SIGTERM to `gpudiag trace` while a hang was suspected printed
    "progress resumed: not a hang (hang_report.json removed)": the ranks' last writes
    read as progress. Nothing progressed, the job was interrupted: the report stays."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-lint",
        "--no-profile", "--hang-timeout", "3", "--on-hang", "auto", "--nproc-per-node", "2",
        "--master-port", "29471", str(SUBWORK), "sleep", "300",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        deadline = time.monotonic() + 240
        while not (out / rundir.HANG_REPORT).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.decode("utf-8", "replace")
    assert "hang suspected" in stderr and "progress resumed" not in stderr, stderr[-3000:]
    assert _manifest(out)["status"] == "interrupted", stderr[-3000:]
    assert (out / rundir.HANG_REPORT).exists()
