"""Discovery: which directories are runs, which ranks, nodes and traces they hold, and
which separately written directories (one per node or per launch) are one job."""

from __future__ import annotations

import gzip
import os
import re
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudiag.numfmt import plural
from gpudiag.rundir.clock import MAX_CLOCK_OFFSET_NS
from gpudiag.rundir.files import (
    _what_is,
    bad_input,
    is_dir,
    is_regular_file,
    lexists,
    list_dir,
    open_regular,
    read_json,
)
from gpudiag.rundir.layout import (
    _NODE_DIR_RE,
    _NODE_MANIFEST_RE,
    _RANK_DIR_RE,
    BENCH,
    CLOCK,
    HANG_REPORT,
    INFLIGHT,
    LAST_CALL,
    LINT,
    LIVE_INFLIGHT,
    MANIFEST,
    MAX_WORLD_SIZE,
    RANK_INFO,
    RANK_TABLES,
    RESERVE,
    STACKS,
    STATUS,
    SUMMARY,
    TRACES_DIR,
    manifest_node,
    node_dir,
    trace_path,
)
from gpudiag.rundir.procs import run_status
from gpudiag.rundir.schema import _is_int


def node_run_statuses(run: str | os.PathLike[str]) -> dict[int, str | None]:
    """:func:`run_status` of each node's manifest in ``run`` (manifest.json and every
    manifest.node<K>.json, or those of each per-node directory when ``run`` is their
    parent, see :func:`node_parts`), by node rank; {} without a manifest."""
    run = Path(run)
    found: dict[int, str | None] = {}
    for part in node_parts(run):
        found.update(node_run_statuses(part))
    if found:
        return found
    paths = [run / n for n in list_dir(run) or () if n == MANIFEST or _NODE_MANIFEST_RE.match(n)]
    for path in paths:
        manifest = read_json(path)
        if isinstance(manifest, dict):
            m = _NODE_MANIFEST_RE.match(path.name)
            node = int(m.group(1)) if m else manifest_node(manifest)
            found[node] = run_status(manifest, path)
    return found


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True for a directory written by ``gpudiag trace`` (has a manifest or rank dirs)."""
    path = Path(path)
    names = list_dir(path) if is_dir(path) else None
    if names is None:
        return False
    if MANIFEST in names and not is_dir(path / MANIFEST):
        return True
    return any(
        (_RANK_DIR_RE.match(n) and is_dir(path / n))
        or (_NODE_MANIFEST_RE.match(n) and not is_dir(path / n))
        for n in names
    )


_RANK_TRACE_RE = re.compile(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$")


# What gpudiag writes into a rank<R> directory: one of these makes it a rank's directory.
_RANK_FILES = frozenset(
    {
        RANK_INFO,
        STATUS,
        SUMMARY,
        STACKS,
        INFLIGHT,
        LIVE_INFLIGHT,
        LAST_CALL,
        RESERVE,
        *(f"{t}.jsonl" for t in RANK_TABLES),
    }
)
_NAMED_AT_MOST = 5  # directories / files named in the one line about ignored ones


def _first_names(paths: Sequence[Path]) -> str:
    shown = ", ".join(p.name for p in paths[:_NAMED_AT_MOST])
    return shown + (", ..." if len(paths) > _NAMED_AT_MOST else "")


def _holds_rank_files(path: Path) -> bool:
    """Whether a rank<R> directory holds a file gpudiag writes there (one that cannot be
    listed counts: its reader says why, once)."""
    names = list_dir(path)
    return names is None or any(n in _RANK_FILES for n in names)


def _rank_layout(
    run: Path,
    names: Iterable[str],
    warnings: list[str] | None,
    world: int | None = None,
    *,
    empty_dirs_are_ranks: bool = False,
) -> tuple[list[int], dict[int, Path]]:
    """The ranks of a run directory whose entries are ``names``: its rank<R>
    directories and traces/rank<R>.pt.trace.json[.gz] files; and each rank's trace
    file (:func:`trace_path`). traces/ is listed once (one warning when it cannot be).

    A rank<R> directory holding no file gpudiag writes is not a rank, nor is a trace
    file of a rank outside a known ``world`` (its size): each kind is one line naming how
    many and the first few (issue 28 re-probe, F45/F46: 3,000 empty rank directories or
    5,000 trace files beside a 2-rank run read as "more than 256 ranks" and lost every
    finding). ``empty_dirs_are_ranks``: the live reader's view, where a rank directory is
    created before its first file."""
    ranks = set()
    empty: list[Path] = []
    for name in names:
        m = _RANK_DIR_RE.match(name)
        if not m and name != TRACES_DIR:
            continue
        if not is_dir(run / name):
            bad_input(warnings, f"{run / name}: {_what_is(run / name)}, not a directory; ignored")
        elif m and (empty_dirs_are_ranks or _holds_rank_files(run / name)):
            ranks.add(int(m.group(1)))
        elif m:
            empty.append(run / name)
    if empty:
        empty.sort(key=lambda p: int(p.name[len("rank") :]))
        bad_input(
            warnings,
            f"{run}: {plural(len(empty), 'rank directory', 'rank directories')} holding no "
            f"gpudiag file ({_first_names(empty)}); not ranks, ignored",
        )
    traces: dict[int, Path] = {}
    outside: list[Path] = []
    tdir = run / TRACES_DIR
    if TRACES_DIR in names and is_dir(tdir):
        for name in list_dir(tdir, warnings) or ():
            m = _RANK_TRACE_RE.match(name)
            if m:
                r = int(m.group(1))
                if world is not None and r >= world and r not in ranks:
                    outside.append(tdir / name)
                    continue
                ranks.add(r)
                # trace_path's .gz, else the uncompressed rank<R>.pt.trace.json (read, so
                # that a bad one is a warning, not a silently missing rank)
                if not is_dir(tdir / name) and (name == trace_path(run, r).name or r not in traces):
                    traces[r] = tdir / name
    if outside:
        outside.sort(key=lambda p: int(_RANK_TRACE_RE.match(p.name).group(1)))  # type: ignore[union-attr]
        bad_input(
            warnings,
            f"{tdir}: {plural(len(outside), 'trace file')} of ranks outside the world of "
            f"{world} ({_first_names(outside)}); ignored",
        )
    return sorted(ranks), traces


def run_world_size(run: Path, names: Iterable[str]) -> int | None:
    """The world size the run's manifest.json records, when plausible (no warning: the
    manifest's reader says what is wrong with it)."""
    if MANIFEST not in names:
        return None
    manifest = read_json(run / MANIFEST)
    size = manifest.get("world_size") if isinstance(manifest, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_WORLD_SIZE:
        return size
    return None


def list_ranks(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    names = list(list_dir(run) or ()) if is_dir(run) else []
    return _rank_layout(run, names, None, run_world_size(run, names))[0]


def list_nodes(run: str | os.PathLike[str]) -> list[int]:
    run = Path(run)
    names = list_dir(run) if is_dir(run) else None
    return sorted(
        int(m.group(1)) for n in names or () if (m := _NODE_DIR_RE.match(n)) and is_dir(run / n)
    )


# --------------------------------------------------------------------------- discovery
# Where runs and traces are found: `gpudiag analyze`, the dashboard and the sample runs
# all ask here.

# A profiler trace by name: Kineto's `<worker>[.<ns>].pt.trace.json[.gz]`, or any other
# `*.json[.gz]` (HTA, torchtitan, Megatron dumps). The analysis reads every such file and
# warns, naming it, when one is not a trace.
_TRACE_NAME_RE = re.compile(r"\.(?:pt\.)?trace\.json(?:\.gz)?$|\.json(?:\.gz)?$")
_KINETO_NAME_RE = re.compile(r"\.pt\.trace\.json(?:\.gz)?$")
# JSON documents of a run directory (and of `gpudiag bench`) that are never traces
RUN_FILES = frozenset({MANIFEST, LINT, HANG_REPORT, RANK_INFO, STATUS, SUMMARY, INFLIGHT, BENCH})
_TRACE_MARKERS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"')
_SNIFF_BYTES = 65536


def is_trace_name(name: str) -> bool:
    return bool(_TRACE_NAME_RE.search(name)) and not name.endswith((".jsonl", ".jsonl.gz"))


def trace_name_stem(name: str) -> str:
    """The file name without its trace suffix (``rank3.pt.trace.json.gz`` -> ``rank3``)."""
    return _TRACE_NAME_RE.sub("", name)


def _trace_files_in(directory: Path, warnings: list[str] | None = None) -> list[Path]:
    """The files named like traces in ``directory``: anything but a directory, so that
    a FIFO, a device or a dangling link named like one is refused by the reader with a
    warning rather than passed over."""
    return [
        directory / name
        for name in list_dir(directory, warnings) or ()
        if is_trace_name(name)
        and not name.startswith(".")
        and name not in RUN_FILES
        and not name.startswith(("manifest.", "hang_report."))
        and not is_dir(directory / name)
    ]


def find_traces(path: str | os.PathLike[str], warnings: list[str] | None = None) -> list[Path]:
    """Trace files under ``path``: a gpudiag run dir (its ``traces/``), a directory of
    profiler traces (searched one level deep), or a single file. Chosen by name only: a
    file named like a trace that is not one is for the reader to report. A directory
    that cannot be listed is one warning (with ``warnings``)."""
    path = Path(path)
    if not is_dir(path):
        return [path] if lexists(path) else []
    if is_run_dir(path):  # only its traces/, never its own JSON files
        tdir = path / TRACES_DIR
        return _trace_files_in(tdir, warnings) if is_dir(tdir) else []
    if is_dir(path / TRACES_DIR):
        found = _trace_files_in(path / TRACES_DIR, warnings)
        if found:
            return found
    names = list_dir(path, warnings)
    found = _trace_files_in(path) if names is not None else []
    if found:
        return found
    nested: list[Path] = []
    for name in names or ():
        if is_dir(path / name):
            nested.extend(_trace_files_in(path / name, warnings))
    return nested


def looks_like_trace(path: Path) -> bool:
    """A profiler trace by name (Kineto's, even when damaged) or, for another ``*.json``,
    by its first bytes: how a folder of runs is told apart from folders of other JSON.
    Only a regular file is one (never opened otherwise)."""
    if path.name in RUN_FILES or path.name.startswith((".", "hang_report.")):
        return False
    if not is_regular_file(path):
        return False
    if _KINETO_NAME_RE.search(path.name):
        return True
    if not _TRACE_NAME_RE.search(path.name) or path.name.endswith((".jsonl", ".jsonl.gz")):
        return False
    try:
        with open_regular(path) as raw:
            if path.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                    head = fh.read(_SNIFF_BYTES)
            else:
                head = raw.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    return any(marker in head for marker in _TRACE_MARKERS)


def holds_traces(directory: Path) -> bool:
    return any(looks_like_trace(directory / name) for name in list_dir(directory) or ())


def is_analysable(directory: Path) -> bool:
    """A gpudiag run directory, a directory holding profiler traces itself, or the
    parent of one multi-node job's per-node directories (:func:`node_parts`: read as
    one run)."""
    return is_dir(directory) and (
        is_run_dir(directory) or holds_traces(directory) or bool(node_parts(directory))
    )


def find_runs(root: str | os.PathLike[str], max_depth: int = 2) -> list[Path]:
    """Analysable directories under ``root`` (the root itself when it is one), sorted,
    looking ``max_depth`` folders deep (a root, its runs, and runs grouped one folder
    deeper such as a `gpudiag bench` output)."""
    return _runs_under(Path(root), 0, max_depth)


def _runs_under(directory: Path, depth: int, max_depth: int) -> list[Path]:
    if is_analysable(directory):
        return [directory]
    if depth >= max_depth:
        return []
    children = [
        directory / n for n in list_dir(directory) or () if n[0] != "." and is_dir(directory / n)
    ]
    return [run for child in children for run in _runs_under(child, depth + 1, max_depth)]


def sample_run_paths(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every run under the shipped sample_runs/ (or ``root``): `gpudiag analyze`'s and
    the dashboard's default."""
    from gpudiag.paths import sample_runs_dir

    return find_runs(sample_runs_dir() if root is None else root)


def _job_key(manifest: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What the launchers of one job share: the id node 0 published at start-up
    (``clock.job_id``), else the rendezvous they were given. None for a one-node run."""
    nnodes = str(manifest.get("nnodes") or "1")
    if nnodes in ("1", "1:1"):
        return None
    clock = manifest.get("clock")
    if isinstance(clock, dict) and isinstance(clock.get("job_id"), str):
        return ("job", clock["job_id"])
    launch = manifest.get("launch")
    argv = launch.get("torchrun_argv") if isinstance(launch, dict) else None
    if not isinstance(argv, list):
        return None
    flags = {
        a: b for a, b in zip(argv, [*argv[1:], None], strict=True) if b and not b.startswith("--")
    }
    return (
        "rdzv",
        nnodes,
        flags.get("--rdzv-backend", "static"),
        flags.get("--rdzv-endpoint"),
        flags.get("--rdzv-id"),
        flags.get("--master-addr"),
        flags.get("--master-port"),
    )


def _part_manifest(directory: Path) -> dict[str, Any] | None:
    """The one manifest of a node's own directory (manifest.json, or a single
    manifest.node<K>.json), without warnings: None when there is none or several."""
    listed = list_dir(directory)
    if listed is None:
        return None
    names = [MANIFEST] if MANIFEST in listed and is_regular_file(directory / MANIFEST) else []
    names += [n for n in listed if _NODE_MANIFEST_RE.match(n)]
    if len(names) != 1:
        return None
    obj = read_json(directory / names[0])
    if not isinstance(obj, dict):
        return None
    m = _NODE_MANIFEST_RE.match(names[0])
    if m:
        obj["node_rank"] = int(m.group(1))
    if not isinstance(obj.get("clock"), dict):
        # a launcher killed before it wrote the clock into its manifest left it here
        clock = read_json(node_dir(directory, manifest_node(obj)) / CLOCK)
        if isinstance(clock, dict):
            obj["clock"] = clock
    return obj


def launchers_running(directories: Sequence[str | os.PathLike[str]]) -> bool:
    """Each directory holds one node's manifest whose launcher has not ended (status
    ``running``): per-node directories of a job that may still be starting."""
    manifests = [_part_manifest(Path(d)) for d in directories]
    return bool(manifests) and all(
        m is not None and m.get("status") == "running" for m in manifests
    )


def same_job(directories: Sequence[Path]) -> bool:
    """Whether these run directories are the parts of one job: the per-node directories
    of a multi-node job (each holds one node's manifest, the node ranks differ, they name
    the same job: node 0's id, else the same rendezvous), or ranks launched separately by
    hand (:func:`_separately_launched`); either way their launchers ran at the same
    time."""
    if len(directories) < 2:
        return False
    manifests = [_part_manifest(Path(d)) for d in directories]
    if any(m is None for m in manifests):
        return False
    ms = [m for m in manifests if m is not None]
    if not _separately_launched(ms):
        keys = {_job_key(m) for m in ms}
        if len(keys) != 1 or None in keys:
            return False
        if len({manifest_node(m) for m in ms}) != len(ms):
            return False
    # on node 0's clock (a node's manifest stamps are its own); a running node ends now
    starts = [t + _manifest_offset(m) for m in ms if isinstance(t := m.get("start_ns"), int)]
    ends = [
        t + _manifest_offset(m) if m.get("end_ns") else time.time_ns()
        for m in ms
        if isinstance(t := m.get("end_ns") or 0, int)
    ]
    if len(starts) != len(ms) or len(ends) != len(ms):
        return False
    return max(starts) <= min(ends)


def _separately_launched(manifests: Sequence[Mapping[str, Any]]) -> bool:
    """Ranks of one job each started by its own `gpudiag trace` (one process each, the
    rank passed to init_process_group): the same rendezvous (``init_method``, not a
    store object), the same world size, and traced ranks that do not overlap."""
    methods = {m.get("init_method") for m in manifests}
    sizes = {m.get("world_size") for m in manifests}
    if len(methods) != 1 or len(sizes) != 1:
        return False
    method, size = methods.pop(), sizes.pop()
    if not isinstance(method, str) or method in ("", "store") or not isinstance(size, int):
        return False
    traced = [m.get("traced_ranks") for m in manifests]
    if not all(isinstance(t, list) and t for t in traced):
        return False
    flat = [r for t in traced if isinstance(t, list) for r in t]
    return len(flat) == len(set(flat)) and all(isinstance(r, int) and 0 <= r < size for r in flat)


def _manifest_offset(manifest: Mapping[str, Any]) -> int:
    """The node's clock offset to node 0 its manifest records (0 when none)."""
    clock = manifest.get("clock")
    offset = clock.get("offset_ns") if isinstance(clock, dict) else None
    if isinstance(offset, int) and _is_int(offset) and abs(offset) <= MAX_CLOCK_OFFSET_NS:
        return offset
    return 0


def node_parts(directory: str | os.PathLike[str]) -> list[Path]:
    """The per-node run directories of one job directly under ``directory`` (ordered
    by node), or [] when ``directory`` is itself a run or holds no such set."""
    directory = Path(directory)
    if not is_dir(directory) or is_run_dir(directory):
        return []
    children = [directory / n for n in list_dir(directory) or () if is_run_dir(directory / n)]
    if not same_job(children):
        return []
    return sorted(children, key=lambda p: manifest_node(_part_manifest(p) or {}))


def launched_separately(directories: Sequence[Path]) -> bool:
    """Parts of one job (:func:`same_job`) whose ranks were each started by their own
    `gpudiag trace`, not the per-node directories of a multi-node launch."""
    manifests = [_part_manifest(Path(d)) for d in directories]
    return (
        len(manifests) > 1
        and all(m is not None for m in manifests)
        and _separately_launched([m for m in manifests if m is not None])
    )


def group_node_dirs(paths: Sequence[Path]) -> list[list[Path]]:
    """`gpudiag analyze A B ...`: the paths as runs to analyse, the per-node
    directories of one job (all of the paths) as one."""
    if len(paths) >= 2 and all(is_dir(p) for p in paths) and same_job(paths):
        return [sorted(paths, key=lambda p: manifest_node(_part_manifest(Path(p)) or {}))]
    return [[p] for p in paths]
