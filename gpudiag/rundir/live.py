"""Live reading (`gpudiag watch`, the dashboard): tables tailed as they grow, a node's
or a whole job's new rows batch by batch."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.numfmt import plural
from gpudiag.rundir.clock import INSTANT_COLUMNS, MAX_CLOCK_OFFSET_NS, _shift_instants
from gpudiag.rundir.discover import (
    _rank_layout,
    group_node_dirs,
    is_run_dir,
    list_nodes,
    node_parts,
)
from gpudiag.rundir.files import (
    RunFormatError,
    _not_regular,
    bad_input,
    is_dir,
    lexists,
    list_dir,
    open_regular,
    read_json,
    read_problem,
)
from gpudiag.rundir.layout import (
    _NODE_MANIFEST_RE,
    CLOCK,
    COLLECTIVE_TIMES,
    COLLECTIVES,
    GPU_SAMPLES,
    HOST_SAMPLES,
    LIVE_INFLIGHT,
    MANIFEST,
    NODE_TABLES,
    RANK_INFO,
    STATUS,
    STEPS,
    _worst_status,
    manifest_node,
    node_dir,
    rank_dir,
    table_path,
)
from gpudiag.rundir.merge import merge_manifests
from gpudiag.rundir.procs import launcher_pid_problem, run_status
from gpudiag.rundir.read import hang_report_states
from gpudiag.rundir.schema import SCHEMAS, _bad_fields, _is_int

# --------------------------------------------------------------------------- live reading


class TableTail:
    """Incremental reader of one append-only JSON Lines table (`gpudiag watch`).

    Each :meth:`read` returns only the complete rows appended since the previous call:
    it remembers the byte offset after the last whole line, so a torn last line (a row
    being written right now) is left for the next call, never reported. A file that
    shrank or was replaced (other inode) is read again from its start (``resets``
    counts those). ``tail_bytes`` bounds the work: the first read, and any read that
    finds more than that many new bytes, starts that far from the end of the file at
    the next line start (``skipped_bytes`` counts what was passed over), so a reader
    that keeps only recent rows costs the same on a file of any length.

    A missing file is no problem (not written yet); one that is there but cannot be read
    (permission denied, a directory, a FIFO or a device in its place) gives no rows and
    says why in :attr:`problems`, as do malformed lines skipped so far.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        tail_bytes: int | None = None,
        schema: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.tail_bytes = tail_bytes
        self.schema = schema  # rows with a field of the wrong type or value are skipped
        self.mistyped = 0
        self.first_mistyped = ""
        self.offset = 0
        self.resets = 0
        self.malformed = 0
        self.skipped_bytes = 0
        self._inode: int | None = None
        self.problem: str | None = None  # why the last read could not read the file

    @property
    def problems(self) -> list[str]:
        """One line per problem, each naming the file: the last read's, and the malformed
        lines skipped so far."""
        out = [self.problem] if self.problem else []
        if self.malformed:
            out.append(f"{self.path}: {plural(self.malformed, 'malformed line')} skipped")
        if self.mistyped:  # the words of iter_jsonl, which `analyze` reads the table with
            out.append(
                f"{self.path}: skipped {plural(self.mistyped, 'row')} with a field of the "
                f"wrong type or value (first: {self.first_mistyped})"
            )
        return out

    def read(self) -> list[dict[str, Any]]:
        self.problem = None
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []  # not written yet
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path}: {read_problem(exc)}"
            return []
        if not stat.S_ISREG(st.st_mode):  # never a FIFO or a device
            self.problem = f"{self.path}: {read_problem(_not_regular(self.path, st.st_mode))}"
            return []
        if self._inode is not None and (st.st_ino != self._inode or st.st_size < self.offset):
            self.offset = 0  # truncated, or rotated to a new file
            self.resets += 1
        self._inode = st.st_ino
        if st.st_size <= self.offset:
            return []
        start = self.offset
        align = False
        if self.tail_bytes is not None and st.st_size - start > self.tail_bytes:
            start = st.st_size - self.tail_bytes
            align = start > 0
        try:
            with open_regular(self.path) as fh:
                fh.seek(start)
                data = fh.read(st.st_size - start)
        except OSError as exc:
            self.problem = f"{self.path}: {read_problem(exc)}"
            return []
        if align:  # begin at the first line start after the jump
            first = data.find(b"\n")
            if first < 0:
                return []
            data = data[first + 1 :]
            start += first + 1
        end = data.rfind(b"\n")
        if end < 0:
            return []  # only a torn line so far: read again next time
        self.skipped_bytes += start - self.offset
        self.offset = start + end + 1
        return self._parse(data[: end + 1])

    def _parse(self, chunk: bytes) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for line in chunk.split(b"\n"):
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except (ValueError, UnicodeDecodeError):
                self.malformed += 1
                continue
            if not isinstance(row, dict):
                self.malformed += 1
            elif self.schema is not None and (problems := _bad_fields(row, self.schema)):
                self.mistyped += 1
                self.first_mistyped = self.first_mistyped or problems[0]
            else:
                rows.append(row)
        return rows


def _loads(data: bytes) -> Any:
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a dependency
        return json.loads(data)
    return orjson.loads(data)


# Bytes read at most from the end of each table on a live reader's first read (and after
# a jump): enough for the recent window `gpudiag watch` keeps, whatever the file length.
LIVE_TAIL_BYTES = {
    STEPS: 48 * 1024,  # ~370 step rows (gpudiag watch keeps its window + 200)
    COLLECTIVES: 256 * 1024,  # ~700 collective rows
    COLLECTIVE_TIMES: 128 * 1024,
    GPU_SAMPLES: 64 * 1024,
    HOST_SAMPLES: 16 * 1024,
}
LIVE_RANK_TABLES = (STEPS, COLLECTIVES, COLLECTIVE_TIMES)


@dataclass
class LiveBatch:
    """What a :class:`LiveReader` poll found: new rows since the last poll, and the
    current small documents."""

    t_ns: int
    status: str | None  # run_status() of the manifest; None without a manifest
    manifest: dict[str, Any]
    node_manifests: dict[int, dict[str, Any]]
    hang_report: bool  # a hang watchdog ended the job
    rank_rows: dict[str, dict[int, list[dict[str, Any]]]]  # table -> rank -> new rows
    node_rows: dict[str, dict[int, list[dict[str, Any]]]]  # table -> node -> new rows
    rank_info: dict[int, dict[str, Any]]
    statuses: dict[int, dict[str, Any]]
    inflight: dict[int, dict[str, Any]]  # rank -> inflight_live.json
    warnings: list[str] = field(default_factory=list)
    # A hang watchdog suspects a hang and left the job running (--on-hang auto/report).
    hang_suspected: bool = False
    # Some node's manifest says running and its launcher is alive: the run is still being
    # written, whatever ``status`` (the worst node's) says already.
    writing: bool = False


class LiveReader:
    """Reads a run directory while the job writes it: each :meth:`poll` returns the
    rows appended since the previous one (see :class:`TableTail`) and the current
    manifest, statuses and live in-flight collectives. New rank and node directories
    are picked up as they appear; ``manifest.node<K>.json`` files are read as they are."""

    def __init__(
        self, run: str | os.PathLike[str], tail_bytes: dict[str, int] | None = None
    ) -> None:
        self.run = Path(run)
        if not is_dir(self.run):
            raise RunFormatError(f"{self.run}: not a directory")
        try:
            self._dir_id: tuple[int, int] | None = _dir_id(self.run)
        except OSError:
            self._dir_id = None
        self.tail_bytes = dict(LIVE_TAIL_BYTES if tail_bytes is None else tail_bytes)
        self._tails: dict[tuple[str, str, int], TableTail] = {}
        self._rank_info: dict[int, dict[str, Any]] = {}
        self._statuses: dict[int, dict[str, Any]] = {}
        self._inflight: dict[int, dict[str, Any]] = {}
        self._inflight_mtime: dict[int, int] = {}
        self._inflight_problem: dict[int, str] = {}  # rank -> why its file was unreadable
        self._clock: dict[int, int] = {}  # node -> offset to node 0 (node<K>/clock.json)

    def _clock_offsets(
        self, nodes: list[int], manifests: Mapping[int, Mapping[str, Any]]
    ) -> dict[int, int]:
        """Each node's clock offset, as the loader takes it (:func:`clock_offsets`): its
        manifest's ``clock``, else its ``node<K>/clock.json``; read again each poll until
        one holds a measurement (the launcher writes them after the rendezvous)."""
        for n in sorted(set(nodes) | set(manifests)):
            if n == 0 or n in self._clock:
                continue
            record = manifests.get(n, {}).get("clock")
            if not isinstance(record, dict) or "offset_ns" not in record:
                record = read_json(node_dir(self.run, n) / CLOCK)
            if isinstance(record, dict) and ("offset_ns" in record or "error" in record):
                offset = record.get("offset_ns")
                if isinstance(offset, int) and _is_int(offset):
                    self._clock[n] = offset if abs(offset) <= MAX_CLOCK_OFFSET_NS else 0
                else:
                    self._clock[n] = 0
        return {n: o for n, o in self._clock.items() if o}

    def _tail(self, kind: str, table: str, index: int) -> TableTail:
        key = (kind, table, index)
        tail = self._tails.get(key)
        if tail is None:
            base = rank_dir(self.run, index) if kind == "rank" else node_dir(self.run, index)
            schema = table if table in SCHEMAS else None
            tail = TableTail(table_path(base, table), self.tail_bytes.get(table), schema)
            self._tails[key] = tail
        return tail

    def malformed_rows(self) -> int:
        return sum(t.malformed for t in self._tails.values())

    def poll(self) -> LiveBatch:
        """The new rows and current documents. Every file that is there but could not
        be read this time (and each table's malformed lines) is one line naming it in
        ``warnings``; the rest is read as usual."""
        warnings: list[str] = []
        lost = self._lost()
        if lost is not None:
            return self._lost_batch(*lost)
        manifest = read_json(self.run / MANIFEST, warnings)
        if manifest is not None and not isinstance(manifest, dict):
            bad_input(warnings, f"{self.run / MANIFEST}: not a JSON object; ignored")
        manifest = manifest if isinstance(manifest, dict) else {}
        statuses = [self._status(manifest, self.run / MANIFEST, warnings)] if manifest else []
        node_manifests: dict[int, dict[str, Any]] = {}
        names = list_dir(self.run, warnings) or ()
        for name in names:
            m = _NODE_MANIFEST_RE.match(name)
            extra = read_json(self.run / name, warnings) if m else None
            if m and isinstance(extra, dict):
                node_manifests[int(m.group(1))] = extra
                statuses.append(self._status(extra, self.run / name, warnings))
        status = _worst_status(statuses) if statuses else None
        by_node = dict(node_manifests)
        if manifest:
            by_node.setdefault(manifest_node(manifest), manifest)
        # a rank directory that cannot be listed is one line, not one per file in it
        ranks = [
            r
            for r in _rank_layout(self.run, names, warnings, empty_dirs_are_ranks=True)[0]
            if not lexists(rank_dir(self.run, r))
            or (
                is_dir(rank_dir(self.run, r))
                and list_dir(rank_dir(self.run, r), warnings) is not None
            )
        ]
        for r in ranks:
            self._read_docs(r, warnings)
        rank_rows = {
            t: {r: self._tail("rank", t, r).read() for r in ranks} for t in LIVE_RANK_TABLES
        }
        nodes = list_nodes(self.run)
        node_rows = {t: {n: self._tail("node", t, n).read() for n in nodes} for t in NODE_TABLES}
        for tail in self._tails.values():
            for line in tail.problems:
                bad_input(warnings, line)
        offsets = self._clock_offsets(nodes, by_node)
        rank_offsets: dict[int, int] = {}
        if offsets:  # a multi-node run: every node's rows on node 0's clock
            for r, info in self._rank_info.items():
                node = info.get("node_rank")
                if isinstance(node, int) and offsets.get(node):
                    rank_offsets[r] = offsets[node]
            for table in rank_rows.values():
                for r, rows in table.items():
                    _shift_instants(rows, rank_offsets.get(r, 0))
            for table in node_rows.values():
                for n, rows in table.items():
                    _shift_instants(rows, offsets.get(n, 0))
        hang_ended, hang_suspected = hang_report_states(self.run)
        return LiveBatch(
            t_ns=time.time_ns(),
            status=status,
            manifest=manifest,
            node_manifests=node_manifests,
            hang_report=hang_ended,
            hang_suspected=hang_suspected,
            rank_rows=rank_rows,
            node_rows=node_rows,
            rank_info=_shifted_docs(self._rank_info, rank_offsets),
            statuses=_shifted_docs(self._statuses, rank_offsets),
            inflight=_shifted_docs(self._inflight, rank_offsets),
            warnings=warnings,
            writing="running" in statuses,
        )

    def _lost(self) -> tuple[str, str] | None:
        """(state, why) when the run directory can no longer be read at all: ``gone``
        (deleted, moved, or replaced by another directory or a file since the reader
        opened it) or ``unreadable`` (there, but it cannot be listed); else None."""
        try:
            ident = _dir_id(self.run)
            if ident is None:
                return "gone", "the run directory is gone (replaced by a file while watched)"
            os.listdir(self.run)
        except (FileNotFoundError, NotADirectoryError):
            return "gone", "the run directory is gone (deleted or moved while watched)"
        except (OSError, ValueError) as exc:
            return "unreadable", f"the run directory cannot be read any more ({read_problem(exc)})"
        if self._dir_id is not None and ident != self._dir_id:
            return "gone", "the run directory is gone (replaced by another directory while watched)"
        return None

    def _lost_batch(self, state: str, why: str) -> LiveBatch:
        """A poll of a run directory that is no more: ``state`` (not a run status: the
        run's own end is unknown), one line naming the directory, the documents read
        before; no new rows."""
        return LiveBatch(
            t_ns=time.time_ns(),
            status=state,
            manifest={},
            node_manifests={},
            hang_report=False,
            rank_rows={t: {} for t in LIVE_RANK_TABLES},
            node_rows={t: {} for t in NODE_TABLES},
            rank_info=dict(self._rank_info),
            statuses=dict(self._statuses),
            inflight={},
            warnings=[f"{self.run}: {why}"],
            writing=False,
        )

    @staticmethod
    def _status(manifest: dict[str, Any], path: Path, warnings: list[str]) -> str | None:
        """:func:`run_status`, and one line naming the manifest when its launcher record
        is one no launcher writes (a pid "123" or 1e300): that run is not running."""
        launcher = manifest.get("launcher")
        problem = None if launcher is None else launcher_pid_problem(launcher)
        if problem and manifest.get("status") == "running":
            bad_input(warnings, f"{path}: {problem}; the run is taken as not running")
        return run_status(manifest, path)

    def _read_docs(self, rank: int, warnings: list[str]) -> None:
        """rank_info until it names the backend, status.json until it exists, and
        inflight_live.json when its mtime changed: a few stats per rank per poll. A
        document that is there but unreadable is a line in ``warnings`` at every poll."""
        rdir = rank_dir(self.run, rank)
        info = self._rank_info.get(rank)
        if info is None or info.get("backend") is None:
            fresh = _live_doc(rdir / RANK_INFO, warnings)
            if fresh is not None:
                self._rank_info[rank] = fresh
        if rank not in self._statuses:
            status = _live_doc(rdir / STATUS, warnings)
            if status is not None and not isinstance(status.get("status", ""), str):
                # `"status": 5` (probe 28c: a traceback in `watch --once`): no status
                bad_input(
                    warnings,
                    f"{rdir / STATUS}: ignored field(s) of the wrong type or value: 'status' must be a string",
                )
                status = None
            if status is not None:
                self._statuses[rank] = status
        path = rdir / LIVE_INFLIGHT
        try:
            mtime = os.stat(path).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            self._inflight_problem.pop(rank, None)
            return
        except OSError as exc:
            bad_input(warnings, f"{path}: {read_problem(exc)}")
            return
        if self._inflight_mtime.get(rank) != mtime:
            found: list[str] = []
            live = _live_doc(path, found)
            self._inflight_mtime[rank] = mtime  # read again only once it changes
            if live is not None:
                self._inflight[rank] = live
                self._inflight_problem.pop(rank, None)
            elif found:
                self._inflight_problem[rank] = found[0]
        if rank in self._inflight_problem:
            bad_input(warnings, self._inflight_problem[rank])


# What a live reader says of a run directory it can no longer read (beside RUN_STATUSES).
LIVE_LOST_STATES = ("gone", "unreadable")


def _dir_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory ``path``; None when it is no directory."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _live_doc(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    """A rank's small JSON document for a live reader: None when missing (not written
    yet) or unusable, the latter with one line naming it in ``warnings``."""
    said = len(warnings)
    obj = read_json(path, warnings)
    if isinstance(obj, dict) or (obj is None and (len(warnings) > said or not lexists(path))):
        return obj
    bad_input(warnings, f"{path}: not a JSON object; ignored")
    return None


# Instants of the live documents (inflight_live.json's entries) beside the tables' own.
_LIVE_INSTANTS = INSTANT_COLUMNS | {"enter_ns"}


def _shifted_docs(
    docs: Mapping[int, dict[str, Any]], offsets: Mapping[int, int]
) -> dict[int, dict[str, Any]]:
    """rank -> document, the instants of a rank on another node's clock (top level and
    in lists of entries) put on node 0's, in copies: the kept documents stay as read."""
    out = dict(docs)
    for rank, offset in offsets.items():
        doc = docs.get(rank)
        if doc is None or not offset:
            continue
        copy = {k: _shift_value(k, v, offset) for k, v in doc.items()}
        for key, value in doc.items():
            if isinstance(value, list):
                copy[key] = [
                    {k: _shift_value(k, v, offset) for k, v in e.items()}
                    if isinstance(e, dict)
                    else e
                    for e in value
                ]
        out[rank] = copy
    return out


def _shift_value(key: str, value: Any, offset: int) -> Any:
    return value + offset if key in _LIVE_INSTANTS and _is_int(value) else value


class JobLiveReader:
    """Reads the per-node run directories of one multi-node job while it runs (each
    launcher its own ``--out``), as one run: one :class:`LiveReader` per directory, so
    every table keeps its own remembered offset, and each poll's batches merged the way
    :func:`load_run` merges the directories (:func:`merge_manifests`, the worst node's
    status; ranks and nodes are disjoint, each node wrote its own, every node's rows
    already on node 0's clock).

    Given the parent of the directories, new node directories of the job are picked up
    as they appear (:func:`node_parts`, looked at every ``REDISCOVER_S``)."""

    REDISCOVER_S = 5.0

    def __init__(
        self,
        parts: Sequence[str | os.PathLike[str]],
        parent: str | os.PathLike[str] | None = None,
        tail_bytes: dict[str, int] | None = None,
    ) -> None:
        self.parent = Path(parent) if parent is not None else None
        self.tail_bytes = tail_bytes
        self.readers: dict[Path, LiveReader] = {}
        self._found_at = time.monotonic()  # the parts were just found
        for part in parts:
            self._add(Path(part))
        if not self.readers:
            raise RunFormatError(f"{parent}: no node directories")
        self.run = self.parent or Path(os.path.commonpath([str(p) for p in self.readers]))

    def _add(self, part: Path) -> None:
        if part not in self.readers:
            self.readers[part] = LiveReader(part, self.tail_bytes)

    @property
    def parts(self) -> list[Path]:
        return list(self.readers)

    def malformed_rows(self) -> int:
        return sum(r.malformed_rows() for r in self.readers.values())

    def poll(self) -> LiveBatch:
        now = time.monotonic()
        if self.parent is not None and now - self._found_at >= self.REDISCOVER_S:
            self._found_at = now
            for part in node_parts(self.parent):
                self._add(part)
        return merge_live_batches([r.poll() for r in self.readers.values()])


def merge_live_batches(batches: Sequence[LiveBatch]) -> LiveBatch:
    """One job's :class:`LiveBatch` from its nodes' directories' batches."""
    manifests: dict[int, dict[str, Any]] = {}
    for b in batches:
        if b.manifest:
            manifests.setdefault(manifest_node(b.manifest), b.manifest)
        for n, m in b.node_manifests.items():
            manifests.setdefault(n, m)
    merged = merge_manifests(sorted(manifests.items())) if manifests else {}
    first = min(manifests) if manifests else 0
    statuses = [b.status for b in batches if b.status is not None]

    def union(
        attr: str,
    ) -> dict[str, dict[int, list[dict[str, Any]]]]:
        out: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for b in batches:
            for table, rows in getattr(b, attr).items():
                out.setdefault(table, {}).update(rows)
        return out

    def docs(attr: str) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for b in batches:
            out.update(getattr(b, attr))
        return out

    status = _worst_status(statuses) if statuses else None
    if batches and all(b.status in LIVE_LOST_STATES for b in batches):
        status = min(str(b.status) for b in batches)  # every node directory: gone first
    return LiveBatch(
        t_ns=max(b.t_ns for b in batches),
        status=status,
        manifest=merged,
        node_manifests={n: m for n, m in manifests.items() if n != first},
        hang_report=any(b.hang_report for b in batches),
        hang_suspected=any(b.hang_suspected for b in batches),
        rank_rows=union("rank_rows"),
        node_rows=union("node_rows"),
        rank_info=docs("rank_info"),
        statuses=docs("statuses"),
        inflight=docs("inflight"),
        warnings=[w for b in batches for w in b.warnings],
        writing=any(b.writing for b in batches),
    )


def open_live(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tail_bytes: dict[str, int] | None = None,
) -> LiveReader | JobLiveReader:
    """The live reader of a run as :func:`load_run` would read it: a run directory, the
    per-node directories of one job (a list of them, or a parent holding them, found
    and grouped as `gpudiag analyze` does: :func:`node_parts`, :func:`group_node_dirs`).
    Raises :class:`RunFormatError` (one line) for anything else."""
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        if len(paths) == 1:
            return open_live(paths[0], tail_bytes)
        for p in paths:
            if not is_run_dir(p):
                raise RunFormatError(f"{p}: not a gpudiag run directory")
        groups = group_node_dirs(paths)
        if len(groups) != 1:
            raise RunFormatError(
                f"{' '.join(map(str, paths))}: not the per-node directories of one job "
                "(one node each, the same job, at the same time)"
            )
        return JobLiveReader(groups[0], tail_bytes=tail_bytes)
    run = Path(path)
    parts = node_parts(run)
    if parts:
        return JobLiveReader(parts, parent=run, tail_bytes=tail_bytes)
    return LiveReader(run, tail_bytes)
