"""The live reader and live state on real recorded run directories (sample_runs/,
copied to tmp and appended to / torn / truncated there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag import rundir
from gpudiag.analysis import live_snapshot as live

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_runs"


@pytest.fixture
def straggler_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "ddp4_straggler", run, ignore=shutil.ignore_patterns("traces"))
    return run


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_tail_returns_only_new_complete_rows(straggler_run: Path) -> None:
    path = rundir.table_path(rundir.rank_dir(straggler_run, 0), rundir.STEPS)
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:10]))
    tail = rundir.TableTail(path)
    assert [r["step"] for r in tail.read()] == list(range(10))
    assert tail.read() == []  # nothing new
    with open(path, "ab") as fh:  # two whole rows and a torn third
        fh.write(lines[10] + lines[11] + lines[12][:20])
    assert [r["step"] for r in tail.read()] == [10, 11]
    assert tail.read() == []  # the torn row is not an error, and not returned yet
    with open(path, "ab") as fh:
        fh.write(lines[12][20:])
    assert [r["step"] for r in tail.read()] == [12]
    assert tail.malformed == 0 and tail.resets == 0


def test_tail_rereads_a_truncated_or_replaced_file(straggler_run: Path) -> None:
    path = rundir.table_path(rundir.rank_dir(straggler_run, 1), rundir.STEPS)
    lines = _lines(path)
    tail = rundir.TableTail(path)
    assert len(tail.read()) == len(lines)
    path.write_bytes(b"".join(lines[:3]))  # truncated in place
    assert [r["step"] for r in tail.read()] == [0, 1, 2]
    assert tail.resets == 1
    fresh = path.with_name("new.jsonl")  # rotated: a new file under the same name
    fresh.write_bytes(b"".join(lines[5:]))
    os.replace(fresh, path)
    assert [r["step"] for r in tail.read()] == list(range(5, len(lines)))
    assert tail.resets == 2


def test_tail_bytes_reads_only_the_end_from_a_line_start(straggler_run: Path) -> None:
    path = rundir.table_path(rundir.rank_dir(straggler_run, 2), rundir.COLLECTIVES)
    lines = _lines(path)
    budget = sum(len(x) for x in lines[-5:]) + 10  # the last five rows and part of one
    tail = rundir.TableTail(path, tail_bytes=budget)
    rows = tail.read()
    assert [r["record_id"] for r in rows] == [json.loads(x)["record_id"] for x in lines[-5:]]
    assert tail.malformed == 0 and tail.skipped_bytes > 0


def test_malformed_row_counted_not_raised(straggler_run: Path) -> None:
    path = rundir.table_path(rundir.rank_dir(straggler_run, 0), rundir.STEPS)
    tail = rundir.TableTail(path)
    tail.read()
    with open(path, "ab") as fh:
        fh.write(b"{not json\n[1, 2]\n")
    assert tail.read() == []
    assert tail.malformed == 2


def test_snapshot_names_the_straggler_like_analyze(straggler_run: Path) -> None:
    (straggler_run / "manifest.node1.json").write_text("{}")  # a second node's manifest
    reader = rundir.LiveReader(straggler_run)
    window = live.LiveWindow()
    batch = reader.poll()
    assert set(batch.node_manifests) == {1}
    window.add(batch)
    snap = live.snapshot(window, batch)
    assert snap.state == "ok"
    assert snap.lagging == [2]  # sample_runs/README: rank 2 sleeps 40 ms in forward
    assert [r.rank for r in snap.ranks] == [0, 1, 2, 3]
    assert all(r.step == 14 and r.status == "ok" for r in snap.ranks)
    assert snap.nodes and snap.nodes[0].node == 0 and snap.nodes[0].mem_total


def test_lagging_is_analyzes_straggler_finding() -> None:
    from gpudiag.analysis.pipeline import analyze

    for name in ("ddp4_straggler", "ddp2_dataloader_bound"):
        result = analyze(SAMPLES / name)
        expected = sorted({r for f in result.findings if f.kind == "straggler" for r in f.ranks})
        reader = rundir.LiveReader(SAMPLES / name)
        window = live.LiveWindow()
        batch = reader.poll()
        window.add(batch)
        assert live.snapshot(window, batch).lagging == expected, name


def test_incremental_refreshes_equal_one_read(straggler_run: Path) -> None:
    """Feeding the tables a few rows at a time gives the same state as reading them whole."""
    full = {}
    for r in range(4):
        for table in rundir.LIVE_RANK_TABLES:
            path = rundir.table_path(rundir.rank_dir(straggler_run, r), table)
            full[path] = _lines(path)
            path.write_bytes(b"")
    reader = rundir.LiveReader(straggler_run)
    window = live.LiveWindow()
    lagging = live.Lagging(every_s=0.0)
    for upto in range(0, 40, 3):
        for path, lines in full.items():
            path.write_bytes(b"".join(lines[:upto]))
        batch = reader.poll()
        window.add(batch)
        snap = live.snapshot(window, batch, lagging=lagging)
    assert snap.lagging == [2]
    assert [r.step for r in snap.ranks] == [14] * 4


def test_a_rank_that_dumped_later_keeps_the_straggler_named(straggler_run: Path) -> None:
    """Probe 31k, N2: the live page said "Lagging ranks: none" beside rank 1 55 ms late,
    and `watch --json` gave no lagging rank in 5 of 15 samples of a steady straggler
    (late_ms null with the window set in 4). Each rank dumps its Flight Recorder when
    its own ring and clock say so; the window ends at the newest step every rank has
    collectives for, but a rank's arrivals were trimmed on its own newest step: the rank
    that dumped ahead kept none of the window's steps. On the recorded run, rank 2 (the
    straggler) and then rank 0 ahead of the others by 6 steps, at every window size that
    fits: named each time, late_ms from the same collectives."""
    tables = {
        (r, t): rundir.table_path(rundir.rank_dir(straggler_run, r), t)
        for r in range(4)
        for t in (rundir.COLLECTIVES, rundir.COLLECTIVE_TIMES)
    }
    rows = {k: [json.loads(x) for x in _lines(p)] for k, p in tables.items()}
    for ahead in (2, 0):
        for steps in (3, 4, 5):
            for (r, t), path in tables.items():
                last = 14 if r == ahead else 8  # this rank dumped 6 steps later than the rest
                kept = [
                    x
                    for x in rows[(r, t)]
                    if not isinstance(x.get("step"), int) or x["step"] <= last
                ]
                if t == rundir.COLLECTIVE_TIMES:
                    kept = []  # only the dumped Flight Recorder rows
                path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in kept))
            window = live.LiveWindow(steps)
            batch = rundir.LiveReader(straggler_run).poll()
            window.add(batch)
            snap = live.snapshot(window, batch, window=steps)
            assert snap.lagging_window == [9 - steps, 8], (ahead, steps)
            assert snap.lagging == [2], (ahead, steps, [r.late_ms for r in snap.ranks])
            late = {r.rank: r.late_ms for r in snap.ranks}
            assert late[2] is not None and late[2] == max(v or 0 for v in late.values())


def test_window_stays_bounded(straggler_run: Path) -> None:
    window = live.LiveWindow(steps=5)
    reader = rundir.LiveReader(straggler_run)
    window.add(reader.poll())
    assert all(len(rows) <= 5 + live._STEP_SLACK for rows in window.steps.values())
    rank_live = live.rank_live(0, window.steps[0], 5, 0)
    assert rank_live[0] == 14


def test_stuck_needs_the_threshold_and_names_the_missing_rank() -> None:
    t0 = 1_000_000_000_000
    entry = {"pg_name": "0", "seq": 42, "op": "all_reduce", "enter_ns": t0, "pg_ranks": [0, 1, 2]}
    inflight = {0: {"inflight": [entry]}, 2: {"inflight": [dict(entry, enter_ns=t0 + 10**9)]}}
    now = t0 + 12 * 10**9
    assert live.stuck_collectives(inflight, [0, 1, 2], set(), now, 20.0) == []
    (stuck,) = live.stuck_collectives(inflight, [0, 1, 2], set(), now, 10.0)
    assert (stuck.pg, stuck.seq, stuck.op) == ("0", 42, "all_reduce")
    assert stuck.arrived == [0, 2] and stuck.missing == [1]
    assert stuck.waiting_s == 12.0
    # a rank that ended (status.json) no longer counts as waiting
    assert live.stuck_collectives(inflight, [0, 1, 2], {0, 2}, now, 10.0) == []


def test_watch_cli_json_schema_and_bad_input(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(SAMPLES / "ddp4_straggler"), "--once",
         "--json"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(proc.stdout)
    assert {"state", "ranks", "lagging", "stuck"} <= set(snap)
    assert set(snap["ranks"][0]) >= {
        "rank", "node", "step", "steps_per_s", "last_step_ms", "median_step_ms",
        "since_last_step_s",
    }  # fmt: skip
    assert snap["lagging"] == [2]
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(tmp_path), "--once"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not a gpudiag run" in proc.stderr


@pytest.mark.slow  # two CLI processes; minutes on a loaded 2-core machine
def test_watch_live_view_ends_with_the_run() -> None:
    """Without --once the view refreshes until the run is no longer running: on a
    finished run it draws once and exits 0."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120")
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(SAMPLES / "ddp4_straggler")],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "state: ok" in proc.stdout and "lagging: rank 2" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "watch", str(SAMPLES / "ddp4_straggler"), "--json"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert json.loads(line)["state"] == "ok"


def test_the_lagging_windows_stated_delay_is_the_captures() -> None:
    """The live views say how far the lagging window may trail the newest step (issue 31,
    browser probe: 875-924 shown beside step 985 without a word): the Flight Recorder
    rows' age limit in capture."""
    from gpudiag.analysis import live_snapshot as live
    from gpudiag.capture import collectives

    assert live.COLLECTIVES_DELAY_S * 1_000_000_000 == collectives._DUMP_MAX_AGE_NS
    assert live.COLLECTIVES_MIN_DELAY_S * 1_000_000_000 == collectives._DUMP_MIN_AGE_NS


def test_the_flight_recorder_is_written_as_often_as_its_cost_allows() -> None:
    """Probe 31j, D7: the live lagging window trailed the newest step by ~120 steps on a
    13-steps/s job, because the ring was dumped every 10 s whatever a dump cost. The age
    limit now follows the last dump's own duration (0.25 % of the wall time: the dump runs
    on the training thread), 1-10 s: a ring of a few hundred entries (a few ms) every 1-4
    s, a full ring of 2000 (28-42 ms, FACTS.md) every 10 s as before."""
    from gpudiag.capture import collectives

    assert collectives.dump_age_ns(None) == 1_000_000_000
    assert collectives.dump_age_ns(2_000_000) == 1_000_000_000  # 2 ms: the floor
    assert collectives.dump_age_ns(9_000_000) == 3_600_000_000  # ~460 entries
    assert collectives.dump_age_ns(35_000_000) == 10_000_000_000  # a full ring: the cap
    assert collectives.dump_age_ns(80_000_000) == 10_000_000_000  # never past the cap


@pytest.mark.parametrize(
    "run, lagging",
    [
        (SAMPLES / "ddp4_straggler", 2),  # rank 2 sleeps 40 ms in forward
        (REPO / "tests" / "fixtures" / "busy_host" / "lightning_rank1_data_40ms_3_hogs", 1),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_the_live_chart_tells_the_lagging_rank(run: Path, lagging: int) -> None:
    """Probe 31j, D8: the live chart drew each rank's median step, and the lagging rank's
    bar was the shorter one (the others' steps hold their wait for it). It now draws the
    step as data loading + the rest, beside each rank's lateness at collectives (mean
    after the first rank, the lagging window): the lagging rank's is the tallest, and each
    bar is the table's number."""
    from gpudiag.report import figures, tables

    reader = rundir.LiveReader(run)
    window = live.LiveWindow()
    batch = reader.poll()
    window.add(batch)
    snap = live.snapshot(window, batch)
    assert snap.lagging == [lagging]
    fig = figures.live_rank_figure(snap)
    bars = {t.name: t for t in fig.data}
    late = bars[figures.LIVE_LATE]
    ranks = [r.rank for r in snap.ranks]
    assert ranks[list(late.y).index(max(late.y))] == lagging
    others = [v for r, v in zip(ranks, late.y, strict=True) if r != lagging]
    assert max(late.y) > 4 * max(others)  # told apart at a glance, not by a few %
    table = tables.live_rank_frame(snap)
    assert list(late.y) == table["late at collectives ms"].tolist()
    data = bars["data loading"]
    assert list(data.y) == table["data wait ms"].tolist()
    rest = next(t for n, t in bars.items() if n.startswith(figures.LIVE_REST))
    for d, r, step in zip(data.y, rest.y, table["median step ms"], strict=True):
        assert d + r == pytest.approx(step)
