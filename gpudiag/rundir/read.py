"""Readers of single run files: JSON documents checked against their schema, JSON
Lines tables row by row (bounded lines, bounded bytes), hang reports, status."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from gpudiag.numfmt import plural
from gpudiag.rundir.files import (
    _SURROGATE_HINT,
    _not_unicode,
    _size_text,
    bad_input,
    lexists,
    loads_json,
    max_table_bytes,
    open_regular,
    path_stat,
    read_json,
    read_problem,
)
from gpudiag.rundir.layout import (
    HANG_REPORT,
    LAST_CALL,
    MANIFEST,
    MAX_WORLD_SIZE,
    RANK_INFO,
    STATUS,
    STATUS_FINISHING,
    hang_report_paths,
    rank_dir,
)
from gpudiag.rundir.schema import (
    MAX_DEPTH,
    _bad_fields,
    _digits,
    _is_int,
    _too_deep,
    check_fields,
    check_hang_report,
)

# One row of a table; a longer line is skipped (the other kinds' limits: files.py).
MAX_LINE_BYTES = 1 << 20


def read_last_call(
    run: str | os.PathLike[str], rank: int, warnings: list[str] | None = None
) -> dict[str, Any] | None:
    """The user collective ``rank`` entered last (op, pg_name, seq, bytes, callsite):
    None when the rank never entered one (no file), or, with one warning naming the
    file, when it cannot be read."""
    path = rank_dir(run, rank) / LAST_CALL
    st = path_stat(path) if lexists(path) else None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return None  # the slot its writer creates at start: the rank entered no call
    if not lexists(path):
        return None
    return read_object(path, "call", warnings)


def read_hang_reports(run: Path, warnings: list[str] | None) -> dict[str, Any] | None:
    """Every node's hang report of a run directory, merged (None when there is none)."""
    reports = []
    for node, path in hang_report_paths(run):
        report = read_object(path, HANG_REPORT, warnings)
        if report is not None:
            reports.append((node, report))
    return merge_hang_reports(reports)


def hang_report_states(run: Path) -> tuple[bool, bool]:
    """(ended, suspected): whether some node's hang watchdog ended the job for a hang, and
    whether one only suspects a hang and left the job running (``"ended": false``; the
    report goes away again when progress resumes)."""
    ended = suspected = False
    for _, path in hang_report_paths(run):
        report = read_object(path, HANG_REPORT, None)
        if report is None:
            continue
        if report.get("ended") is False:
            suspected = True
        else:
            ended = True
    return ended, suspected


def merge_hang_reports(reports: list[tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """One report for the job from each node's (a node's watchdog sees only its own ranks,
    so only the report of the node whose rank never arrived can name it). The verdict
    is the one that names a rank outside the collective, or a desync, else node 0's;
    ``node_verdicts`` keeps each node's."""
    if len(reports) <= 1:
        return reports[0][1] if reports else None
    reports = sorted(reports, key=lambda item: item[0])
    merged: dict[str, Any] = {"ranks": {}, "nodes": [node for node, _ in reports]}
    for _, report in reports:
        if isinstance(report.get("ranks"), dict):
            merged["ranks"].update(report["ranks"])
    for key in ("stuck_ranks", "ranks_not_in_collective", "working_ranks"):
        merged[key] = sorted(
            {r for _, rep in reports for r in (rep.get(key) or []) if isinstance(r, int)}
        )
    for key in ("detected_after_s", "t_ns"):
        values = [rep[key] for _, rep in reports if isinstance(rep.get(key), (int, float))]
        if values:
            merged[key] = min(values)
    merged["hang"] = any(rep.get("hang") is True for _, rep in reports)
    merged["desync"] = next(
        (rep["desync"] for _, rep in reports if isinstance(rep.get("desync"), dict)), None
    )
    telling = [
        rep
        for _, rep in reports
        if rep.get("ranks_not_in_collective") or isinstance(rep.get("desync"), dict)
    ]
    chosen = telling[0] if telling else reports[0][1]
    if isinstance(chosen.get("verdict"), str):
        merged["verdict"] = chosen["verdict"]
    merged["node_verdicts"] = {
        str(node): rep["verdict"] for node, rep in reports if isinstance(rep.get("verdict"), str)
    }
    return merged


def read_object(
    path: str | os.PathLike[str], schema: str, warnings: list[str] | None = None
) -> dict[str, Any] | None:
    """A run file holding one JSON object, with its known fields type-checked: None
    (one warning) when missing, unreadable, not an object or absurdly nested."""
    path = Path(path)
    said = len(warnings) if warnings is not None else 0
    obj = read_json(path, warnings)
    if obj is None:
        if warnings is not None and len(warnings) == said and lexists(path):
            bad_input(warnings, f"{path}: not a JSON object (null); ignored")  # probe 28d
        return None
    if not isinstance(obj, dict):
        bad_input(warnings, f"{path}: not a JSON object; ignored")
        return None
    if _too_deep(obj):
        bad_input(warnings, f"{path}: nested deeper than {MAX_DEPTH} levels; ignored")
        return None
    if schema in (MANIFEST, RANK_INFO):
        obj = _plausible_world_size(obj, path, warnings)
    obj = check_fields(obj, schema, path, warnings)
    if schema == MANIFEST and isinstance(obj.get("steps_completed"), dict):
        obj["steps_completed"] = _step_counts(obj["steps_completed"], path, warnings)
    for key in ("failure", "launcher"):
        if schema == MANIFEST and isinstance(obj.get(key), dict):
            obj[key] = check_fields(obj[key], key, f"{path} ({key})", warnings)
    if schema == MANIFEST and isinstance(obj.get("failure"), dict):
        obj["failure"] = _failure_in_range(obj["failure"], obj.get("world_size"), path, warnings)
    if schema == HANG_REPORT:
        obj = check_hang_report(obj, path, warnings)
    return obj


def _plausible_world_size(
    obj: dict[str, Any], path: Path, warnings: list[str] | None
) -> dict[str, Any]:
    """A ``world_size`` outside 1..MAX_WORLD_SIZE (0, 10**12) is dropped with one warning:
    the readers then take the world from the ranks present (issue 28 probe, F11: 10**12
    sized a list of every rank in ``compare`` and ``analyze --html``, MemoryError)."""
    size = obj.get("world_size")
    if isinstance(size, int) and not isinstance(size, bool) and not 1 <= size <= MAX_WORLD_SIZE:
        shown = str(size) if abs(size) < 10**20 else f"of {_digits(size)} digits"
        bad_input(
            warnings,
            f"{path}: world_size {shown} is not a plausible world size "
            f"(1..{MAX_WORLD_SIZE}); taken as unknown",
        )
        obj = {k: v for k, v in obj.items() if k != "world_size"}
    return obj


def _step_counts(counts: dict, path: Path, warnings: list[str] | None) -> dict[str, int]:
    """The manifest's steps completed per rank, ``{"0": 15, ...}``: entries that are not a
    rank and a count of steps (or null: a rank whose count is unknown) are dropped with
    one warning (probe 28c's B05, "lots")."""
    kept = {
        key: n
        for key, n in counts.items()
        if re.fullmatch(r"\d{1,9}", str(key)) and (n is None or (_is_int(n) and n >= 0))
    }
    if len(kept) < len(counts):
        dropped = [str(k)[:20] for k in counts if k not in kept][:5]
        bad_input(
            warnings,
            f"{path}: ignored steps_completed entries that are no rank's count of steps: {dropped}",
        )
    return kept


def _failure_in_range(
    failure: dict[str, Any], world_size: object, path: Path, warnings: list[str] | None
) -> dict[str, Any]:
    """A manifest ``failure`` whose rank is no rank of the job (-1, 99 in a world of 3)
    or whose ``consequences`` is not a list: that field is dropped, with one warning
    (eighth probe: "Rank 99 failed first" from a damaged manifest)."""
    rank = failure.get("rank")
    world = world_size if isinstance(world_size, int) and not isinstance(world_size, bool) else None
    if isinstance(rank, int) and (rank < 0 or (world is not None and rank >= world)):
        where = f" of {world}" if world is not None else ""
        bad_input(
            warnings, f"{path} (failure): rank {rank} is no rank of the world{where}; ignored"
        )
        failure = {**failure, "rank": None}
    consequences = failure.get("consequences")
    if consequences is not None and not isinstance(consequences, list):
        bad_input(warnings, f"{path} (failure): consequences is not a list; ignored")
        failure = {**failure, "consequences": None}
    return failure


class Lines:
    """The lines of a binary file (without their newline), read a block at a time:
    (line number, line, whether a newline ended it, whether it may hold a lone
    surrogate). A line longer than MAX_LINE_BYTES is skipped (``long_lines`` counts
    them), and nothing past ``limit`` bytes is read (``over``: the file goes on; the
    line the limit cuts is dropped)."""

    BLOCK = 1 << 20

    def __init__(self, fh: BinaryIO, limit: int) -> None:
        self.fh = fh
        self.limit = limit
        self.over = False
        self.long_lines = 0
        self.first_long = 0
        self._lineno = 0

    def _long(self) -> None:
        self.long_lines += 1
        self.first_long = self.first_long or self._lineno

    def __iter__(self) -> Iterator[tuple[int, bytes, bool, bool]]:
        carry = b""  # the start of a line whose end is not read yet
        skipping = False  # inside a line longer than MAX_LINE_BYTES
        total = 0
        while True:
            room = self.limit - total
            block = self.fh.read(min(self.BLOCK, room + 1))
            total += len(block)
            if len(block) > room:
                self.over = True
                block = block[:room]
            pieces = block.split(b"\n")
            tail = pieces.pop()  # after the block's last newline
            hinted = _SURROGATE_HINT.search(block) is not None
            for i, piece in enumerate(pieces):
                if i == 0:
                    piece, carry = carry + piece, b""
                    if skipping:  # the end of a long line
                        skipping = False
                        continue
                    hint = _SURROGATE_HINT.search(piece) is not None  # it may span blocks
                else:
                    hint = hinted
                self._lineno += 1
                if len(piece) > MAX_LINE_BYTES:
                    self._long()
                    continue
                yield self._lineno, piece, True, hint
            if not skipping:
                carry = carry + tail if not pieces else tail
                if len(carry) > MAX_LINE_BYTES:
                    self._lineno += 1
                    self._long()
                    carry, skipping = b"", True
            if self.over or not block:
                break
        if carry and not self.over:  # the last line, without a newline
            self._lineno += 1
            yield self._lineno, carry, False, _SURROGATE_HINT.search(carry) is not None


def iter_jsonl(
    path: str | os.PathLike[str],
    warnings: list[str] | None = None,
    schema: str | None = None,
    max_bytes: int | None = None,
) -> Iterator[dict]:
    """Rows of a JSON Lines file, read a row at a time: a line longer than
    MAX_LINE_BYTES is skipped, and nothing past ``max_bytes`` (default
    :func:`max_table_bytes`) is read. A torn or malformed line, and with ``schema`` a row
    with a field of the wrong type or value (SCHEMAS), is skipped with one warning naming the
    file and the first such line; lone surrogates in strings become U+FFFD (one
    warning). A file that is not a regular file is one warning. It never raises for
    what is on disk."""
    path = Path(path)
    limit = max_table_bytes() if max_bytes is None else max_bytes
    try:
        fh = open_regular(path)
    except OSError as exc:
        bad_input(warnings, f"{path}: {read_problem(exc)}")
        return
    bad = 0
    first_bad = 0
    torn_tail = False  # the one bad line is the unterminated last one: a write cut short
    mistyped = 0
    first_mistyped = ""
    fixed = 0
    first_fixed = 0
    lines = Lines(fh, limit)
    with fh:
        try:
            for lineno, raw, complete, hinted in lines:
                if not raw.strip():
                    continue
                try:
                    if hinted:
                        row, changed = loads_json(raw)
                    else:
                        row, changed = json.loads(raw), 0
                except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                    row, changed = None, 0
                if not isinstance(row, dict) or _too_deep(row):
                    bad += 1
                    first_bad = first_bad or lineno
                    torn_tail = not complete
                    continue
                if changed:
                    fixed += changed
                    first_fixed = first_fixed or lineno
                problems = _bad_fields(row, schema) if schema else []
                if problems:
                    mistyped += 1
                    first_mistyped = first_mistyped or f"line {lineno}: {problems[0]}"
                    continue
                yield row
        except OSError as exc:
            bad_input(warnings, f"{path}: {read_problem(exc)}")
    long_lines, first_long = lines.long_lines, lines.first_long
    if lines.over:
        bad_input(
            warnings,
            f"{path}: larger than the {_size_text(limit)} limit of a table; rows past it "
            "not read (GPUDIAG_MAX_TABLE_BYTES raises it)",
        )
    if long_lines:
        bad_input(
            warnings,
            f"{path}: skipped {plural(long_lines, 'line')} longer than {_size_text(MAX_LINE_BYTES)}, "
            f"first at line {first_long}",
        )
    if bad == 1 and torn_tail:
        # A rank killed mid-write leaves its last row unfinished: expected, not bad input.
        if warnings is not None:
            warnings.append(
                f"{path}: ignored its unfinished last line (the rank stopped mid-write)"
            )
    elif bad:
        bad_input(
            warnings,
            f"{path}: skipped {plural(bad, 'malformed line')}, first at line {first_bad} "
            "(torn write from a crash?)",
        )
    if fixed:
        bad_input(warnings, _not_unicode(path, fixed, f" (first at line {first_fixed})"))
    if mistyped:
        bad_input(
            warnings,
            f"{path}: skipped {plural(mistyped, 'row')} with a field of the wrong type or value "
            f"(first at {first_mistyped})",
        )


def final_status_written(run: str | os.PathLike[str], rank: int) -> bool:
    """The rank wrote its final status.json (not the early one of :data:`STATUS_FINISHING`)."""
    status = read_json(rank_dir(run, rank) / STATUS)
    return isinstance(status, dict) and not status.get(STATUS_FINISHING)


def read_rank_json(run: str | os.PathLike[str], rank: int, name: str) -> dict[str, Any] | None:
    """A rank's small JSON document (rank_info, status, inflight_live...) or None when
    missing, unreadable, or not an object: a live reader just tries again later."""
    obj = read_json(rank_dir(run, rank) / name)
    return obj if isinstance(obj, dict) else None
