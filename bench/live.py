"""Cost of `gpudiag watch` per refresh on a long, wide run: 64 ranks, 1 million step rows.

The run directory is SYNTHESISED, and the output says so: the rows of a real recorded
run (sample_runs/ddp4_straggler: 4 ranks, steps 1-14, their collectives and host
samples) are replicated, rank 2 copying the recording's slow rank 2 and the others its ranks 0, 1
and 3 in turn, steps 1-14 repeated with times and
step numbers shifted by one cycle each time, collective sequence numbers shifted so
(pg, seq) stays unique, process groups widened to the 64 ranks. Step rows cover the
whole run (15,625 per rank); collective rows cover the last --coll-steps steps per rank
(the reader never reads further back than its tail budget, see LIVE_TAIL_BYTES, so
older collective rows only cost disk here).

Measured, in this process, with time.process_time (CPU) and wall clock, and the
process's RSS (psutil):

- first refresh (reader, window and snapshot built from nothing) on the 1M-row run and
  on a run 10 times shorter (100k step rows), alternated, --reps times each: flat
  means the long run's first refresh costs about the same as the short run's;
- later refreshes on the long run: before each one, one second of training is appended
  to every rank (--append-steps steps and their collectives); --refreshes of them.
  Flat means CPU per refresh and RSS do not grow with the refresh count.

With --nodes N (N > 1) the run is laid out as the per-node directories of an N-node job
(each launcher its own --out: node<K>/ under one parent, RANKS/N ranks each, node 0's
manifest.json and the others' manifest.node<K>.json, one job id) and watched through
their parent, as `gpudiag watch PARENT` does (rundir.open_live: one JobLiveReader, a
LiveReader per directory).

    python bench/live.py [--reps 3] [--refreshes 30] [--append-steps 20] [--coll-steps 2000]
                         [--nodes 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "sample_runs" / "ddp4_straggler"
RANKS = 64
STEP_ROWS = 1_000_000

sys.path.insert(0, str(REPO))

from gpudiag import rundir  # noqa: E402
from gpudiag.analysis import live_snapshot as live  # noqa: E402


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class Source:
    """The real rows replicated: per source rank, steps 1-14 and their collectives."""

    def __init__(self) -> None:
        self.steps = {}
        self.coll = {}
        for r in range(4):
            rows = [s for s in _rows(rundir.table_path(rundir.rank_dir(SOURCE, r), "steps"))]
            self.steps[r] = [s for s in rows if s["step"] >= 1]
            coll = _rows(rundir.table_path(rundir.rank_dir(SOURCE, r), "collectives"))
            self.coll[r] = [c for c in coll if (c.get("step") or 0) >= 1 and c.get("seq")]
        first = self.steps[0][0]
        self.period = self.steps[0][-1]["end_ns"] - first["start_ns"]
        self.cycle = len(self.steps[0])
        seqs = [c["seq"] for c in self.coll[0]]
        self.seq0, self.seq_span = min(seqs), max(seqs) - min(seqs) + 1
        self.host = _rows(rundir.table_path(rundir.node_dir(SOURCE, 0), "host_samples"))

    @staticmethod
    def source_rank(rank: int) -> int:
        """Rank 2 of the recording is the slow one: only rank 2 copies it, the others
        copy ranks 0, 1 and 3 in turn (copies of one rank would arrive in ties)."""
        return 2 if rank == 2 else (0, 1, 3)[rank % 3]

    def step_lines(self, rank: int, first: int, count: int) -> str:
        src = self.steps[self.source_rank(rank)]
        out = []
        for k in range(first, first + count):
            c, i = divmod(k - 1, self.cycle)
            row = dict(src[i], step=k)
            row["start_ns"] += c * self.period
            row["end_ns"] += c * self.period
            out.append(json.dumps(row, separators=(",", ":")))
        return "\n".join(out) + "\n"

    def coll_lines(self, rank: int, first: int, count: int) -> str:
        src = self.coll[self.source_rank(rank)]
        out = []
        c_first, c_last = (first - 1) // self.cycle, (first + count - 2) // self.cycle
        for c in range(c_first, c_last + 1):
            for row in src:
                k = c * self.cycle + row["step"]
                if not first <= k < first + count:
                    continue
                new = dict(row, step=k, pg_size=RANKS, pg_ranks=list(range(RANKS)))
                new["seq"] = row["seq"] + c * self.seq_span
                new["record_id"] = row["record_id"] + c * 1000
                new["enqueue_ns"] = row["enqueue_ns"] + c * self.period
                out.append(json.dumps(new, separators=(",", ":")))
        return "\n".join(out) + "\n" if out else ""


def node_of(rank: int, nodes: int) -> int:
    return rank // (RANKS // nodes)


def rank_path(run: Path, rank: int, nodes: int) -> Path:
    """The rank's directory: in the run, or in its node's directory under the parent."""
    base = run if nodes == 1 else run / f"node{node_of(rank, nodes)}"
    return rundir.rank_dir(base, rank)


def synthesise(
    root: Path, src: Source, steps_per_rank: int, coll_steps: int, nodes: int = 1
) -> Path:
    run = root / f"run-{steps_per_rank * RANKS}"
    run.mkdir(parents=True)
    manifest = json.loads((SOURCE / rundir.MANIFEST).read_text())
    manifest.update(status="running", world_size=RANKS, launcher=None)
    if nodes == 1:
        (run / rundir.MANIFEST).write_text(json.dumps(manifest))
    for k in range(nodes if nodes > 1 else 0):  # one directory per node, one job
        part = run / f"node{k}"
        part.mkdir()
        mine = dict(manifest, node_rank=k, nnodes=str(nodes), clock={"job_id": run.name})
        name = rundir.MANIFEST if k == 0 else f"manifest.node{k}.json"
        (part / name).write_text(json.dumps(mine))
    for r in range(RANKS):
        d = rank_path(run, r, nodes)
        d.mkdir()
        info = json.loads(
            (rundir.rank_dir(SOURCE, src.source_rank(r)) / rundir.RANK_INFO).read_text()
        )
        info.update(rank=r, world_size=RANKS, node_rank=node_of(r, nodes))
        (d / rundir.RANK_INFO).write_text(json.dumps(info))
        rundir.table_path(d, "steps").write_text(src.step_lines(r, 1, steps_per_rank))
        start = max(1, steps_per_rank - coll_steps + 1)
        rundir.table_path(d, "collectives").write_text(
            src.coll_lines(r, start, steps_per_rank - start + 1)
        )
    for k in range(nodes):
        node = rundir.node_dir(run if nodes == 1 else run / f"node{k}", k)
        node.mkdir()
        rundir.table_path(node, "host_samples").write_text(
            "".join(json.dumps(h) + "\n" for h in src.host)
        )
    return run


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class Watcher:
    def __init__(self, run: Path) -> None:
        self.reader = rundir.open_live(run)  # the run, or the parent of its node dirs
        self.window = live.LiveWindow()
        self.lagging = live.Lagging()

    def refresh(self) -> tuple[float, float, live.LiveSnapshot]:
        c0, w0 = time.process_time(), time.perf_counter()
        batch = self.reader.poll()
        self.window.add(batch)
        snap = live.snapshot(self.window, batch, lagging=self.lagging)
        return (time.process_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3, snap


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return (
        f"median {statistics.median(values):8.1f}  min {min(values):8.1f}  "
        f"q1 {q[0]:8.1f}  q3 {q[2]:8.1f}  max {max(values):8.1f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--refreshes", type=int, default=30)
    p.add_argument("--append-steps", type=int, default=20)
    p.add_argument("--coll-steps", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=1, help="per-node directories (divides 64)")
    ns = p.parse_args()
    if ns.nodes < 1 or RANKS % ns.nodes:
        p.error(f"--nodes {ns.nodes}: expected a divisor of {RANKS}")
    print(
        "SYNTHESISED run directories: rows of the real sample_runs/ddp4_straggler "
        f"replicated to {RANKS} ranks (rank 2 copies the slow rank 2, the others ranks 0, 1, 3)."
    )
    src = Source()
    root = Path(tempfile.mkdtemp(prefix="gpudiag-bench-live-"))
    try:
        t0 = time.perf_counter()
        long_steps = STEP_ROWS // RANKS
        long_run = synthesise(root, src, long_steps, ns.coll_steps, ns.nodes)
        short_run = synthesise(root, src, long_steps // 10, ns.coll_steps, ns.nodes)
        size = sum(f.stat().st_size for f in long_run.rglob("*.jsonl"))
        print(
            f"long run: {long_steps * RANKS:,} step rows ({long_steps:,} per rank), "
            f"{size / 2**20:.0f} MiB of tables; short run: {long_steps // 10 * RANKS:,} "
            f"step rows; written in {time.perf_counter() - t0:.0f} s"
        )
        if ns.nodes > 1:
            print(f"laid out as {ns.nodes} per-node directories, watched through their parent")
        first: dict[str, list[float]] = {"long": [], "short": []}
        first_wall: dict[str, list[float]] = {"long": [], "short": []}
        for rep in range(ns.reps):
            order = ("long", "short") if rep % 2 == 0 else ("short", "long")
            for name in order:
                cpu, wall, snap = Watcher(long_run if name == "long" else short_run).refresh()
                first[name].append(cpu)
                first_wall[name].append(wall)
        print(f"first refresh CPU ms, 1M step rows:   {_spread(first['long'])}")
        print(f"first refresh CPU ms, 100k step rows: {_spread(first['short'])}")
        print(f"first refresh wall ms, 1M step rows:  {_spread(first_wall['long'])}")
        print(f"lagging named on the long run: {snap.lagging}  state: {snap.state}")

        watcher = Watcher(long_run)
        rss0 = _rss()
        _, _, snap = watcher.refresh()
        rss_first = _rss()
        next_step = long_steps + 1
        cpu_ms, wall_ms, rss = [], [], []
        for _ in range(ns.refreshes):
            for r in range(RANKS):
                d = rank_path(long_run, r, ns.nodes)
                with open(rundir.table_path(d, "steps"), "a") as fh:
                    fh.write(src.step_lines(r, next_step, ns.append_steps))
                with open(rundir.table_path(d, "collectives"), "a") as fh:
                    fh.write(src.coll_lines(r, next_step, ns.append_steps))
            next_step += ns.append_steps
            cpu, wall, snap = watcher.refresh()
            cpu_ms.append(cpu)
            wall_ms.append(wall)
            rss.append(_rss())
        half = len(cpu_ms) // 2
        print(
            f"later refreshes ({ns.refreshes}, each after {ns.append_steps} new steps per "
            f"rank = {ns.append_steps * RANKS} step rows):"
        )
        print(f"  CPU ms, all:         {_spread(cpu_ms)}")
        print(f"  CPU ms, first half:  {_spread(cpu_ms[:half])}")
        print(f"  CPU ms, second half: {_spread(cpu_ms[half:])}")
        print(f"  wall ms, all:        {_spread(wall_ms)}")
        print(
            f"  RSS MiB: before {rss0 / 2**20:.0f}, after the first refresh "
            f"{rss_first / 2**20:.0f}, after refresh {half} {rss[half - 1] / 2**20:.0f}, "
            f"after the last {rss[-1] / 2**20:.0f}"
        )
        print(f"  last snapshot: step {snap.ranks[0].step}, lagging {snap.lagging}")
        print(f"load average: {os.getloadavg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
