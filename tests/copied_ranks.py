"""A many-rank run made of links to a few recorded traces, analysed as a cluster's client
would receive it: each source trace's task runs once, and every rank gets a copy of its
source's result (pickled as a worker sends it back) with its own rank and path (as
bench/scale.py --modes replay does)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

from gpudiag.analysis.ingest import LoadJob, LoadResult, RunTasks, share_empty_events


def link_ranks(sources: list[Path], ranks: int, run: Path) -> Path:
    """``run``/rank<r>.pt.trace.json.gz, a link to ``sources[r % len(sources)]``."""
    run.mkdir()
    for r in range(ranks):
        (run / f"rank{r}.pt.trace.json.gz").symlink_to(sources[r % len(sources)])
    return run


def copied_ranks(sources: list[Path]) -> RunTasks:
    """Per-rank tasks of a :func:`link_ranks` run: rank r's result is a copy of source
    r % K's, its rank, world size and path rewritten."""

    def run_tasks(
        task: Callable[[LoadJob], LoadResult], jobs: list[LoadJob]
    ) -> Iterator[tuple[int, LoadResult]]:
        done: dict[int, bytes] = {}
        for i, job in enumerate(jobs):
            rank = int(Path(job[0]).name.split(".")[0].removeprefix("rank"))
            source = rank % len(sources)
            if source not in done:
                done[source] = pickle.dumps(task(job))
            trace, notes = pickle.loads(done[source])
            trace.meta.rank = rank
            trace.meta.world_size = len(jobs)
            trace.meta.path = Path(job[0])
            share_empty_events(trace)
            yield i, (trace, notes)

    return run_tasks
