"""The gpudiag run directory: the one place that knows its file names and formats.

Capture (inside the training processes and the launcher) writes through the writer
helpers here; analysis and the dashboard read through :func:`load_run`. See
docs/run-format.md for the format itself and why it is JSON Lines.

Layout (format version 1)::

    <run>/manifest.json                    launcher (node 0); atomically replaced
    <run>/manifest.node<N>.json            launchers of nodes N > 0
    <run>/lint.json                        lint result for the traced script
    <run>/hang_report.json                 only when the hang watchdog fired
    <run>/bench.json                       only for runs made by `gpudiag bench`
    <run>/traces/rank<R>.pt.trace.json.gz  Kineto trace of the profiled window
    <run>/rank<R>/steps.jsonl              one row per training step
    <run>/rank<R>/collectives.jsonl        one row per collective (Flight Recorder et al.)
    <run>/rank<R>/collective_times.jsonl   completion/start stamps matched on (pg, seq)
    <run>/rank<R>/regions.jsonl            gpudiag.region(...) intervals
    <run>/rank<R>/ddp_stats.jsonl          DDP runtime logging data per sampled step
    <run>/rank<R>/rank_info.json           rank, local rank, host, pid, backend, device
    <run>/rank<R>/status.json              how the rank ended (written last)
    <run>/rank<R>/summary.json             small per-rank summary (written at rank end)
    <run>/rank<R>/stacks.txt               Python stacks dumped by the hang watchdog
    <run>/rank<R>/inflight.json            collectives in flight when the watchdog fired
    <run>/node<N>/gpu_samples.jsonl        NVML samples, every local GPU
    <run>/node<N>/host_samples.jsonl       host CPU/memory samples (always; the only ones without NVML)

All times are integer nanoseconds since the Unix epoch ("trace clock": a Kineto event
at ``ts`` µs is at ``baseTimeNanoseconds + ts * 1000``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FORMAT_VERSION = 1

MANIFEST = "manifest.json"
LINT = "lint.json"
HANG_REPORT = "hang_report.json"
TRACES_DIR = "traces"

STEPS = "steps"
COLLECTIVES = "collectives"
COLLECTIVE_TIMES = "collective_times"
REGIONS = "regions"
DDP_STATS = "ddp_stats"
GPU_SAMPLES = "gpu_samples"
HOST_SAMPLES = "host_samples"

RANK_TABLES = (STEPS, COLLECTIVES, COLLECTIVE_TIMES, REGIONS, DDP_STATS)
NODE_TABLES = (GPU_SAMPLES, HOST_SAMPLES)

RANK_INFO = "rank_info.json"
STATUS = "status.json"
SUMMARY = "summary.json"
STACKS = "stacks.txt"
BENCH = "bench.json"  # gpudiag bench: the comparison table, in the bench folder and each run
INFLIGHT = "inflight.json"  # in-flight collectives + FR dump, written on a hang request

_RANK_DIR_RE = re.compile(r"^rank(\d+)$")
_NODE_DIR_RE = re.compile(r"^node(\d+)$")
_NODE_MANIFEST_RE = re.compile(r"^manifest\.node(\d+)\.json$")


# --------------------------------------------------------------------------- paths


def rank_dir(run: str | os.PathLike[str], rank: int) -> Path:
    return Path(run) / f"rank{rank}"


def node_dir(run: str | os.PathLike[str], node: int) -> Path:
    return Path(run) / f"node{node}"


def table_path(directory: str | os.PathLike[str], table: str) -> Path:
    return Path(directory) / f"{table}.jsonl"


def trace_path(run: str | os.PathLike[str], rank: int) -> Path:
    """Named so TensorBoard's profiler plugin (``<worker>.pt.trace.json.gz``), HTA and
    Perfetto open it unchanged."""
    return Path(run) / TRACES_DIR / f"rank{rank}.pt.trace.json.gz"


def manifest_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    if node == 0:
        return Path(run) / MANIFEST
    return Path(run) / f"manifest.node{node}.json"


# --------------------------------------------------------------------------- writing


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def dumps_line(row: dict[str, Any]) -> str:
    return json.dumps(row, separators=(",", ":"), default=_json_default) + "\n"


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, default=_json_default)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class JsonlWriter:
    """Append-only JSON Lines table. Each row is written and flushed whole, so a crash
    loses at most the row being written (the reader skips a torn last line)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open(  # noqa: SIM115 - held open for the run
            self.path, "a", encoding="utf-8", buffering=1
        )
        self._lock = threading.Lock()

    def write(self, row: dict[str, Any]) -> None:
        line = dumps_line(row)
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(line)
            self._fh.flush()

    def write_text(self, line: str) -> None:
        """Append one row already serialised as a JSON object ending in a newline: the
        hot-path form (a per-step row formatted directly costs ~1 µs, json.dumps ~10)."""
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(line)
            self._fh.flush()

    def write_many(self, rows: Iterable[dict[str, Any]]) -> None:
        text = "".join(dumps_line(r) for r in rows)
        if not text:
            return
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(text)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_rank_table(run: str | os.PathLike[str], rank: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(rank_dir(run, rank), table))


def open_node_table(run: str | os.PathLike[str], node: int, table: str) -> JsonlWriter:
    return JsonlWriter(table_path(node_dir(run, node), table))


def write_rank_json(run: str | os.PathLike[str], rank: int, name: str, obj: Any) -> None:
    write_json_atomic(rank_dir(run, rank) / name, obj)


# --------------------------------------------------------------------------- reading


class RunFormatError(ValueError):
    """A run directory (or one of its files) that cannot be read. The message is one
    line naming the file and the problem."""


def iter_jsonl(path: str | os.PathLike[str], warnings: list[str] | None = None) -> Iterator[dict]:
    """Rows of a JSON Lines file. A torn or malformed line is skipped with a warning
    naming the file and line; it never raises for bad content."""
    path = Path(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        if warnings is not None:
            warnings.append(f"{path}: cannot read ({exc.strerror or exc})")
        return
    bad = 0
    first_bad = 0
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                bad += 1
                first_bad = first_bad or lineno
                continue
            if isinstance(row, dict):
                yield row
            else:
                bad += 1
                first_bad = first_bad or lineno
    if bad and warnings is not None:
        warnings.append(
            f"{path}: skipped {bad} malformed line(s), first at line {first_bad} "
            "(torn write from a crash?)"
        )


def read_json(path: str | os.PathLike[str], warnings: list[str] | None = None) -> Any | None:
    """A small JSON file, or None (with a warning) when missing or unreadable."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        if warnings is not None:
            warnings.append(f"{path}: not valid JSON ({_short(exc)})")
        return None


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True for a directory written by ``gpudiag trace`` (has a manifest or rank dirs)."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / MANIFEST).is_file():
        return True
    return any(_RANK_DIR_RE.match(p.name) and p.is_dir() for p in path.iterdir())


def list_ranks(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    ranks = set()
    for p in run.iterdir() if run.is_dir() else ():
        m = _RANK_DIR_RE.match(p.name)
        if m and p.is_dir():
            ranks.add(int(m.group(1)))
    tdir = run / TRACES_DIR
    if tdir.is_dir():
        for p in tdir.iterdir():
            m = re.match(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$", p.name)
            if m:
                ranks.add(int(m.group(1)))
    return sorted(ranks)


def list_nodes(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    return sorted(
        int(m.group(1))
        for p in (run.iterdir() if run.is_dir() else ())
        if (m := _NODE_DIR_RE.match(p.name)) and p.is_dir()
    )


@dataclass
class Run:
    """Everything in a run directory, as pandas DataFrames and plain dicts.

    Rank tables carry a ``rank`` column, node tables a ``node`` column. Missing tables
    are empty DataFrames, so callers never need to special-case a partial run.
    """

    path: Path
    manifest: dict[str, Any]
    steps: Any
    collectives: Any
    regions: Any
    ddp_stats: Any
    gpu_samples: Any
    host_samples: Any
    rank_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: dict[int, dict[str, Any]] = field(default_factory=dict)
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    trace_files: dict[int, Path] = field(default_factory=dict)
    lint: dict[str, Any] | None = None
    hang_report: dict[str, Any] | None = None
    stacks: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(
            set(self.rank_info)
            | set(self.statuses)
            | set(self.summaries)
            | set(self.trace_files)
            | (set(self.steps["rank"].unique()) if len(self.steps) else set())
        )

    @property
    def world_size(self) -> int | None:
        ws = self.manifest.get("world_size")
        if ws:
            return int(ws)
        sizes = [i.get("world_size") for i in self.rank_info.values() if i.get("world_size")]
        return max(sizes) if sizes else None


def _frame(rows: list[dict], columns: Iterable[str]) -> Any:
    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=list(columns))
    return pd.DataFrame.from_records(rows)


STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns", "data_ns", "optimizer_ns", "source")
COLLECTIVE_COLUMNS = (
    "rank",
    "pg_name",
    "pg_desc",
    "pg_size",
    "pg_ranks",
    "seq",
    "op",
    "in_bytes",
    "out_bytes",
    "dtype",
    "in_sizes",
    "out_sizes",
    "enqueue_ns",
    "start_ns",
    "end_ns",
    "step",
    "record_id",
    "source",
)
REGION_COLUMNS = ("rank", "name", "start_ns", "end_ns", "step")
GPU_COLUMNS = (
    "node",
    "t_ns",
    "gpu",
    "uuid",
    "util_gpu",
    "util_mem",
    "mem_used",
    "mem_total",
    "power_w",
    "sm_clock_mhz",
    "throttle_reasons",
    "pcie_tx_kbs",
    "pcie_rx_kbs",
    "nvlink_tx_kbs",
    "nvlink_rx_kbs",
    "temp_c",
)
HOST_COLUMNS = (
    "node",
    "t_ns",
    "cpu_percent",
    "mem_used",
    "mem_total",
    "proc_cpu_percent",
    "proc_rss",
)


def _read_rank_table(run: Path, ranks: list[int], table: str, warnings: list[str]) -> list[dict]:
    rows: list[dict] = []
    for r in ranks:
        path = table_path(rank_dir(run, r), table)
        if not path.exists():
            continue
        for row in iter_jsonl(path, warnings):
            row["rank"] = r
            rows.append(row)
    return rows


def _merge_collective_times(collectives: list[dict], times: list[dict]) -> None:
    """Fill start/end stamps recorded separately (e.g. by a DDP comm hook) into the
    collective rows, matched on (rank, pg_name, seq)."""
    if not times:
        return
    index = {(c["rank"], c.get("pg_name"), c.get("seq")): c for c in collectives}
    for t in times:
        row = index.get((t["rank"], t.get("pg_name"), t.get("seq")))
        if row is None:
            continue
        for key in ("start_ns", "end_ns"):
            if t.get(key) is not None and row.get(key) is None:
                row[key] = t[key]
        if t.get("source"):
            row["time_source"] = t["source"]


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read a run directory written by ``gpudiag trace``.

    Never raises for bad content: unreadable pieces are skipped and described, one
    line each, in ``Run.warnings``. Raises :class:`RunFormatError` only when ``path``
    is not a run directory at all.
    """
    run = Path(path)
    if not run.is_dir():
        raise RunFormatError(f"{run}: not a directory")
    warnings: list[str] = []
    manifest = read_json(run / MANIFEST, warnings) or {}
    if not isinstance(manifest, dict):
        warnings.append(f"{run / MANIFEST}: not a JSON object; ignored")
        manifest = {}
    version = manifest.get("format_version")
    if version is not None and version > FORMAT_VERSION:
        warnings.append(
            f"{run / MANIFEST}: format_version {version} is newer than this gpudiag "
            f"reads ({FORMAT_VERSION}); reading what it can"
        )
    for p in sorted(run.glob("manifest.node*.json")):
        m = _NODE_MANIFEST_RE.match(p.name)
        extra = read_json(p, warnings)
        if m and isinstance(extra, dict):
            manifest.setdefault("nodes", {})[int(m.group(1))] = extra
    ranks = list_ranks(run)
    nodes = list_nodes(run)

    collectives = _read_rank_table(run, ranks, COLLECTIVES, warnings)
    _merge_collective_times(collectives, _read_rank_table(run, ranks, COLLECTIVE_TIMES, warnings))

    node_rows: dict[str, list[dict]] = {t: [] for t in NODE_TABLES}
    for n in nodes:
        for table in NODE_TABLES:
            p = table_path(node_dir(run, n), table)
            if p.exists():
                for row in iter_jsonl(p, warnings):
                    row["node"] = n
                    node_rows[table].append(row)

    result = Run(
        path=run,
        manifest=manifest,
        steps=_frame(_read_rank_table(run, ranks, STEPS, warnings), STEP_COLUMNS),
        collectives=_frame(collectives, COLLECTIVE_COLUMNS),
        regions=_frame(_read_rank_table(run, ranks, REGIONS, warnings), REGION_COLUMNS),
        ddp_stats=_frame(_read_rank_table(run, ranks, DDP_STATS, warnings), ("rank", "step")),
        gpu_samples=_frame(node_rows[GPU_SAMPLES], GPU_COLUMNS),
        host_samples=_frame(node_rows[HOST_SAMPLES], HOST_COLUMNS),
        lint=read_json(run / LINT, warnings),
        hang_report=read_json(run / HANG_REPORT, warnings),
        warnings=warnings,
    )
    for r in ranks:
        rdir = rank_dir(run, r)
        for name, target in (
            (RANK_INFO, result.rank_info),
            (STATUS, result.statuses),
            (SUMMARY, result.summaries),
        ):
            obj = read_json(rdir / name, warnings)
            if isinstance(obj, dict):
                target[r] = obj
        stacks = rdir / STACKS
        if stacks.is_file():
            result.stacks[r] = stacks.read_text(encoding="utf-8", errors="replace")
        tp = trace_path(run, r)
        if tp.is_file():
            result.trace_files[r] = tp
    return result


def load_summaries(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[int, dict]]:
    """Only the manifest and per-rank summaries: how a 1000-rank run is read without
    touching any raw trace or table."""
    run = Path(path)
    warnings: list[str] = []
    manifest = read_json(run / MANIFEST, warnings) or {}
    summaries: dict[int, dict] = {}
    for r in list_ranks(run):
        obj = read_json(rank_dir(run, r) / SUMMARY, warnings)
        if isinstance(obj, dict):
            summaries[r] = obj
    return manifest, summaries
