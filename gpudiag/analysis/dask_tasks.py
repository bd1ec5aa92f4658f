"""Run the per-rank tasks on a Dask distributed cluster (``gpudiag analyze --scheduler``).

The task is :func:`gpudiag.analysis.ingest.load_task`, the one the local process pool
runs: load one trace and run every per-rank analysis on it (pipeline.prepare_rank).
On the cluster the task then drops the trace's events, so only the per-rank results
travel back; the cross-rank analyses (stragglers, findings) run on the client.

Workers read the traces at the paths the client lists: the run directory must be on a
filesystem every worker sees at the same path (docs/cluster.md). ``distributed`` is an
optional dependency (``pip install 'gpudiag[cluster]'``), imported only here and only
when a scheduler is asked for.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from gpudiag.analysis.ingest import LoadJob, LoadResult
from gpudiag.analysis.trace_model import share_empty_events

INSTALL_HINT = "pip install 'gpudiag[cluster]'"
# How long to wait for the scheduler to answer, and for a first worker to join it
# (GPUDIAG_SCHEDULER_TIMEOUT overrides it, in seconds).
CONNECT_TIMEOUT_S = 10.0
LOCAL_PREFIX = "local:"
# Per-rank tasks in flight at once (DaskTasks): a few per worker keep each one busy while
# results travel back; the rest wait on the client as plain job tuples.
WINDOW_PER_WORKER = 4
WINDOW_MIN = 16


class ClusterError(RuntimeError):
    """The cluster cannot run the analysis (one-line message naming what and where)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ClusterError(
            f"--scheduler needs Dask's distributed package, which is not installed: {INSTALL_HINT}"
        ) from None
    return distributed


def local_workers(spec: str) -> int | None:
    """N for ``local:N`` (a LocalCluster of N worker processes); None for an address."""
    if not spec.startswith(LOCAL_PREFIX):
        return None
    raw = spec[len(LOCAL_PREFIX) :]
    if not raw.isdigit() or int(raw) < 1:
        raise ClusterError(f"--scheduler {spec}: expected local:N with N >= 1 workers")
    return int(raw)


def scheduler_address(spec: str) -> str:
    """``host:port`` gets Dask's default protocol (tcp://)."""
    return spec if "://" in spec else f"tcp://{spec}"


def _on_worker(
    job: LoadJob, task: Callable[[LoadJob], LoadResult]
) -> tuple[LoadResult, str | None]:
    """Runs on a Dask worker: the per-rank task, unless the worker cannot read the file
    (then a one-line reason naming the worker and the path, and no result)."""
    path = job[0]
    if not os.access(path, os.R_OK):
        try:
            from distributed import get_worker

            where = f"Dask worker {get_worker().address}"
        except Exception:  # noqa: BLE001 - the name is a courtesy
            where = "a Dask worker"
        why = "no such file" if not os.path.exists(path) else "permission denied"
        return (None, []), (
            f"{where} cannot read {path} ({why}); workers read the traces at the paths "
            "the client sees: put the run on a filesystem shared by every worker"
        )
    return task(job), None


def _as_given(result: LoadResult, absolute: str, given: str) -> LoadResult:
    trace, warnings = result
    if trace is not None:
        share_empty_events(trace)
    if absolute == given:
        return result
    if trace is not None:
        trace.meta.path = Path(given)
    # keeps each warning's type (rundir.BadInput marks unusable input)
    return trace, [type(w)(w.replace(absolute, given)) for w in warnings]


class DaskTasks:
    """Runs per-rank tasks on a Dask cluster; ``ingest.load_traces(run_tasks=...)``.

    Use as a context manager: it closes the client (and the LocalCluster it started)."""

    def __init__(self, client: Any, cluster: Any = None, label: str = "") -> None:
        self.client = client
        self.cluster = cluster
        self.label = label

    def __call__(
        self, task: Callable[[LoadJob], LoadResult], jobs: list[LoadJob]
    ) -> Iterator[tuple[int, LoadResult]]:
        """Each job's result with its index, as it arrives (ingest.RunTasks); a file no
        worker can read: ClusterError once the others are in."""
        if not jobs:
            return
        # Workers have their own working directory: they get absolute paths, and the
        # results name the files as the client does (as the local pool's would).
        given = [job[0] for job in jobs]
        absolute = [str(Path(p).absolute()) for p in given]
        remote = iter(enumerate(zip(absolute, jobs, strict=True)))
        index: dict[str, int] = {}

        def submit(count: int) -> list[Any]:
            """The next ``count`` jobs, sent to the cluster (one graph update)."""
            batch = list(itertools.islice(remote, count))
            if not batch:
                return []
            futures = self.client.map(
                _on_worker, [(path, *job[1:]) for _, (path, job) in batch], task=task, pure=False
            )
            for (i, _), future in zip(batch, futures, strict=True):
                index[future.key] = i
            return futures

        problems: list[str] = []
        try:
            distributed = _import_distributed()
            # A window of jobs in flight, topped up in batches as results come (each
            # batch is one graph update for the scheduler): neither the scheduler nor
            # this client holds every task of a many-rank run.
            window = self._window()
            # On this client's event loop: as_completed defaults to the default client's
            # (the newest Client in the process), whose loop never hears of these
            # futures' completion when it is another client's: a hang (tests/test_cluster.py
            # watches the scheduler with a second Client).
            arrived = distributed.as_completed(
                submit(window), with_results=True, loop=self.client.loop
            )
        except Exception as exc:  # noqa: BLE001 - a worker-side failure is one line
            raise self._failed(exc) from None
        # Hand each result on as it arrives and release its future, so neither the
        # cluster nor this client holds more than the folded per-rank results.
        while True:
            try:
                future, outcome = next(arrived)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - a worker-side failure is one line
                raise self._failed(exc) from None
            i = index.pop(future.key)
            future.release()
            del future
            if len(index) <= window // 2:
                for more in submit(window - len(index)):
                    arrived.add(more)
            result, problem = outcome
            if problem is not None:
                problems.append(problem)
                continue
            yield i, _as_given(result, absolute[i], given[i])
        if problems:
            more = f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else ""
            raise ClusterError(problems[0] + more)

    def _failed(self, exc: BaseException) -> ClusterError:
        return ClusterError(
            f"the analysis failed on the Dask cluster {self.label} "
            f"({type(exc).__name__}: {_first_line(exc)})"
        )

    def _window(self) -> int:
        """Jobs in flight at once: enough to keep every worker busy."""
        return max(WINDOW_MIN, WINDOW_PER_WORKER * self.workers)

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def __enter__(self) -> DaskTasks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def connect_timeout() -> float:
    raw = os.environ.get("GPUDIAG_SCHEDULER_TIMEOUT")
    try:
        return float(raw) if raw else CONNECT_TIMEOUT_S
    except ValueError:
        return CONNECT_TIMEOUT_S


def connect(spec: str, timeout_s: float | None = None) -> DaskTasks:
    """A client of the scheduler at ``spec`` (``tcp://host:port`` or ``host:port``), or of
    a new ``distributed.LocalCluster`` for ``local:N`` (N single-threaded worker
    processes). Waits up to ``timeout_s`` for the scheduler and for a first worker."""
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    n_local = local_workers(spec)
    distributed = _import_distributed()
    if n_local is not None:
        try:
            cluster = distributed.LocalCluster(
                n_workers=n_local,
                threads_per_worker=1,  # parsing holds the GIL: one process per core
                processes=True,
                # no dashboard; the scheduler's HTTP endpoint on any free port (None
                # still tries 8787 and warns on stderr when another cluster holds it)
                dashboard_address=":0",
                scheduler_kwargs={"dashboard": False},
            )
        except Exception as exc:  # noqa: BLE001 - e.g. no process support
            raise ClusterError(
                f"could not start a local Dask cluster of {n_local} workers "
                f"({type(exc).__name__}: {_first_line(exc)})"
            ) from None
        return DaskTasks(distributed.Client(cluster), cluster, label=spec)
    address = scheduler_address(spec)
    try:
        client = distributed.Client(address, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, a bad address...
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} within {timeout_s:.0f} s "
            f"({type(exc).__name__}: {_first_line(exc)}); start one with `dask scheduler` "
            "and `dask worker ADDRESS`"
        ) from None
    tasks = DaskTasks(client, label=address)
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - TimeoutError
        tasks.close()
        raise ClusterError(
            f"the Dask scheduler at {address} has no workers (none joined within "
            f"{timeout_s:.0f} s); start some with `dask worker {address}`"
        ) from None
    return tasks
