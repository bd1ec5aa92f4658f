"""The DataFrame build: :func:`load_run` reads a run directory (or its parts) into a
:class:`~gpudiag.rundir.schema.Run`, and :func:`load_summaries` its summaries."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.rundir.clock import _rank_offsets, _shift_instants, _shift_rows, clock_offsets
from gpudiag.rundir.discover import _rank_layout, list_nodes, list_ranks, node_parts
from gpudiag.rundir.files import RunFormatError, _Listing, bad_input, is_dir, list_dir, read_text
from gpudiag.rundir.layout import (
    _NODE_MANIFEST_RE,
    COLLECTIVE_TIMES,
    COLLECTIVES,
    DDP_STATS,
    FORMAT_VERSION,
    GPU_SAMPLES,
    HOST_SAMPLES,
    LINT,
    MANIFEST,
    NODE_TABLES,
    RANK_INFO,
    REGIONS,
    STACKS,
    STATUS,
    STEPS,
    SUMMARY,
    TRACES_DIR,
    manifest_node,
    node_dir,
    rank_dir,
    table_path,
)
from gpudiag.rundir.merge import merge_manifests, merge_runs
from gpudiag.rundir.procs import _reader_notes
from gpudiag.rundir.read import iter_jsonl, read_hang_reports, read_object
from gpudiag.rundir.schema import (
    COLLECTIVE_COLUMNS,
    GPU_COLUMNS,
    HOST_COLUMNS,
    REGION_COLUMNS,
    STEP_COLUMNS,
    Run,
    _is_int,
)
from gpudiag.rundir.tables import Table, _frame

if TYPE_CHECKING:
    from gpudiag.lint.report import LintReport


def _read_rank_table(
    run: Path, ranks: list[int], table: str, warnings: list[str], listing: _Listing
) -> list[dict]:
    rows: list[dict] = []
    for r in ranks:
        path = table_path(rank_dir(run, r), table)
        if not listing.has(path):
            continue
        for row in iter_jsonl(path, warnings, schema=table):
            row["rank"] = r
            rows.append(row)
    return rows


def _read_rank_frame(
    run: Path,
    ranks: list[int],
    table: str,
    warnings: list[str],
    listing: _Listing,
    offsets: Mapping[int, int],
    columns: Iterable[str],
) -> Any:
    """A per-rank table as a DataFrame, built a block of rows at a time (:class:`Table`),
    each row's instants moved by its rank's clock offset (``offsets``) as it is read."""
    built = Table()
    for r in ranks:
        path = table_path(rank_dir(run, r), table)
        if not listing.has(path):
            continue
        offset = offsets.get(r)
        repeats = _RepeatedSteps() if table == STEPS else None
        for row in iter_jsonl(path, warnings, schema=table):
            row["rank"] = r
            if repeats is not None:
                repeats.see(row.get("step"))
            if offset:
                _shift_instants([row], offset)
            built.append(row)
        if repeats is not None:
            repeats.warn(path, warnings)
    return built.frame(columns)


class _RepeatedSteps:
    """Step numbers a rank's steps table holds more than once: a step is written once, so
    a repeat is a damaged file or a job restarted into the same directory. Its rows are
    analysed as they are, with one warning naming the file (issue 28, probe 28c's B09:
    twenty rows numbered 10**18 moved a finding's cost without a word)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self.count = 0
        self.first: int | None = None

    def see(self, step: object) -> None:
        if not isinstance(step, int):
            return
        if step in self._seen:
            self.count += 1
            if self.first is None:
                self.first = step
        else:
            self._seen.add(step)

    def warn(self, path: Path, warnings: list[str]) -> None:
        if self.count:
            bad_input(
                warnings,
                f"{path}: {self.count} row(s) repeat the number of an earlier step "
                f"(first: step {self.first}); a damaged file or a job restarted into the "
                "same directory: each row is analysed as its own step",
            )


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
        # where the call was issued: the user's line, and a framework's own line
        for key in ("callsite", "library_callsite"):
            if isinstance(t.get(key), str) and row.get(key) is None:
                row[key] = t[key]


def load_run(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Run:
    """Read a run directory written by ``gpudiag trace``; or the directories of one
    multi-node job's nodes (a list of them, or a parent holding them, see
    :func:`node_parts`), merged into one run.

    Never raises for bad content: unreadable pieces are skipped and described, one
    line each, in ``Run.warnings``. Raises :class:`RunFormatError` only when ``path``
    is not a run directory at all.
    """
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        if len(paths) == 1:
            return load_run(paths[0])
        for p in paths:
            if not is_dir(p):
                raise RunFormatError(f"{p}: not a directory")
        return merge_runs([_load_one(p) for p in paths], Path(os.path.commonpath(paths)))
    run = Path(path)
    if not is_dir(run):
        raise RunFormatError(f"{run}: not a directory")
    parts = node_parts(run)
    if parts:
        return merge_runs([_load_one(p) for p in parts], run)
    return _load_one(run)


def _read_manifests(
    run: Path, warnings: list[str], listing: _Listing | None = None
) -> dict[str, Any]:
    """manifest.json, with every manifest.node<K>.json under ``nodes`` and the whole
    job's status and hosts (:func:`merge_manifests`). A node's own directory holds only
    its manifest.node<K>.json: that one is then the manifest."""
    names = (listing or _Listing(warnings)).names(run)
    manifest = read_object(run / MANIFEST, MANIFEST, warnings) if MANIFEST in names else None
    if manifest is not None:
        _reader_notes(manifest, run / MANIFEST, warnings)
    nodes: list[tuple[int, dict[str, Any]]] = []
    for name in sorted(names):
        m = _NODE_MANIFEST_RE.match(name)
        extra = read_object(run / name, MANIFEST, warnings) if m else None
        if m and isinstance(extra, dict):
            _reader_notes(extra, run / name, warnings)
            nodes.append((int(m.group(1)), extra))
    if manifest is None:
        if not nodes:
            return {}
        return merge_manifests(nodes)
    return merge_manifests([(manifest_node(manifest), manifest), *nodes]) if nodes else manifest


def _load_one(run: Path) -> Run:
    warnings: list[str] = []
    names = list_dir(run, warnings)
    if names is None:
        raise RunFormatError(warnings[0])
    listing = _Listing(warnings)
    manifest = _read_manifests(run, warnings, listing)
    version = manifest.get("format_version")
    if version is not None and version > FORMAT_VERSION:
        warnings.append(
            f"{run / MANIFEST}: format_version {version} is newer than this gpudiag "
            f"reads ({FORMAT_VERSION}); reading what it can"
        )
    world = manifest.get("world_size")
    ranks, trace_files = _rank_layout(run, names, warnings, world if _is_int(world) else None)
    nodes = list_nodes(run)
    offsets = clock_offsets(run, manifest, nodes, warnings, listing)
    rank_offsets = _rank_offsets(run, ranks, offsets)

    collectives = _read_rank_table(run, ranks, COLLECTIVES, warnings, listing)
    _merge_collective_times(
        collectives, _read_rank_table(run, ranks, COLLECTIVE_TIMES, warnings, listing)
    )

    node_tables: dict[str, Table] = {t: Table() for t in NODE_TABLES}
    for n in nodes:
        for table in NODE_TABLES:
            p = table_path(node_dir(run, n), table)
            if listing.has(p):
                for row in iter_jsonl(p, warnings, schema=table):
                    row["node"] = n
                    if offsets.get(n):
                        _shift_instants([row], offsets[n])
                    node_tables[table].append(row)
    if offsets:
        _shift_rows(collectives, "rank", rank_offsets)

    result = Run(
        path=run,
        manifest=manifest,
        steps=_read_rank_frame(run, ranks, STEPS, warnings, listing, rank_offsets, STEP_COLUMNS),
        collectives=_frame(collectives, COLLECTIVE_COLUMNS),
        regions=_read_rank_frame(
            run, ranks, REGIONS, warnings, listing, rank_offsets, REGION_COLUMNS
        ),
        ddp_stats=_read_rank_frame(
            run, ranks, DDP_STATS, warnings, listing, rank_offsets, ("rank", "step")
        ),
        gpu_samples=node_tables[GPU_SAMPLES].frame(GPU_COLUMNS),
        host_samples=node_tables[HOST_SAMPLES].frame(HOST_COLUMNS),
        lint=_read_lint(run, warnings) if LINT in names else None,
        hang_report=read_hang_reports(run, warnings),
        warnings=warnings,
        clock_offsets=rank_offsets,
        trace_files=trace_files,
    )
    for r in ranks:
        _read_rank_files(run, r, result, listing)
    _note_all_traces_missing(run, result)
    if offsets:
        for docs in (result.rank_info, result.statuses):
            _shift_rows([d for r, d in docs.items() if r in rank_offsets], None, rank_offsets)
    return result


def _note_all_traces_missing(run: Path, result: Run) -> None:
    """One line when the ranks' summary.json say their profile window was written
    (``trace``) and not one trace is here (traces/ deleted or emptied): the run is then
    analysed from its tables only. Said as for one missing trace of several (a note, not
    bad input); a run recorded with --no-profile names no trace and stays quiet (issue 28
    re-probe, F48: "No findings: nothing costs a noticeable share", exit 0, no word)."""
    tdir = str(run / TRACES_DIR)
    if result.trace_files or any(w.startswith(f"{tdir}:") for w in result.warnings):
        return  # traces present, or traces/ itself unusable: its own line said so
    written = sorted(
        r for r, s in result.summaries.items() if isinstance(s.get("trace"), str) and s["trace"]
    )
    if written:
        n = len(written)
        named = ", ".join(map(str, written[:8])) + (", ..." if n > 8 else "")
        result.warnings.append(
            f"{run / TRACES_DIR}: traces for 0 of {n} {'rank' if n == 1 else 'ranks'} present "
            f"(the summary.json of {'rank' if n == 1 else 'ranks'} {named} "
            f"{'names its' if n == 1 else 'name their'} trace); analysed from the run's "
            "tables (steps, collectives) only"
        )


def _read_lint(run: Path, warnings: list[str]) -> LintReport | None:
    """lint.json, through gpudiag.lint's reader (imported here: only a run that has one
    loads the linter's package)."""
    from gpudiag.lint.report import read_lint

    return read_lint(run, warnings)


def _read_rank_files(run: Path, r: int, result: Run, listing: _Listing) -> None:
    rdir = rank_dir(run, r)
    for name, target in (
        (RANK_INFO, result.rank_info),
        (STATUS, result.statuses),
        (SUMMARY, result.summaries),
    ):
        obj = read_object(rdir / name, name, result.warnings) if listing.has(rdir / name) else None
        if obj is not None:
            target[r] = _own_rank(obj, r, rdir / name, result.warnings)
    if listing.has(rdir / STACKS):
        text = read_text(rdir / STACKS, result.warnings)
        if text is not None:
            result.stacks[r] = text


def _own_rank(doc: dict[str, Any], rank: int, path: Path, warnings: list[str]) -> dict[str, Any]:
    """A rank's document naming another rank (`rank1/rank_info.json` saying rank 0: a
    copied or damaged file) is read as its directory's rank, with one warning."""
    said = doc.get("rank")
    if _is_int(said) and said != rank:
        bad_input(warnings, f"{path}: says rank {said}; read as rank {rank}, its directory's")
        return {**doc, "rank": rank}
    return doc


def load_summaries(
    path: str | os.PathLike[str], warnings: list[str] | None = None
) -> tuple[dict[str, Any], dict[int, dict]]:
    """Only the manifest and per-rank summaries: how a 1000-rank run is read without
    touching any raw trace or table. What could not be read is described in
    ``warnings``, one line each."""
    run = Path(path)
    parts = node_parts(run)
    if parts:
        loaded = [load_summaries(p, warnings) for p in parts]
        manifest = merge_manifests([(manifest_node(m), m) for m, _ in loaded])
        return manifest, {r: s for _, part in loaded for r, s in part.items()}
    warnings = [] if warnings is None else warnings
    listing = _Listing(warnings)
    manifest = _read_manifests(run, warnings, listing)
    summaries: dict[int, dict] = {}
    for r in list_ranks(run):
        path = rank_dir(run, r) / SUMMARY
        obj = read_object(path, SUMMARY, warnings) if listing.has(path) else None
        if obj is not None:
            summaries[r] = obj
    return manifest, summaries
