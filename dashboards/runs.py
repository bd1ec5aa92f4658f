"""Which runs the dashboard may show, and a content key for caching their analysis.

Everything the UI can open is discovered here from the run roots given on the command
line; a path that does not resolve inside one of those roots is refused.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from gpudiag import rundir
from gpudiag.paths import sample_runs_dir

DEFAULT_ROOTS = (sample_runs_dir(), Path("gpudiag_runs"))

_FINGERPRINT_MAX_FILES = 5000
MAX_DEPTH = 2  # a root, its runs, and runs grouped one folder deeper (e.g. a bench)


class PathOutsideRoots(ValueError):
    """A path chosen in the UI that is not inside any run root."""


@dataclass(frozen=True)
class RunRef:
    label: str  # what the UI shows: "<parent folder>/<run name>" (run_labels)
    path: Path  # resolved


def discover_runs(roots: list[Path]) -> list[RunRef]:
    """Runs under each root (the root itself when it is one), sorted by path; labels by
    :func:`run_labels`, e.g. ``sample_runs/ddp2_healthy``."""
    paths: list[Path] = []
    seen: set[Path] = set()
    for root in roots:
        root = Path(root).resolve()
        if not rundir.is_dir(root):
            continue
        for run in rundir.find_runs(root, MAX_DEPTH):
            run = run.resolve()
            if run in seen or not is_inside(run, roots):
                continue
            seen.add(run)
            paths.append(run)
    return [RunRef(label=label, path=p) for p, label in zip(paths, run_labels(paths), strict=True)]


def run_labels(paths: list[Path]) -> list[str]:
    """A run's name, the same however the dashboard was started (its folder or the run
    directories themselves: "runs/live1" beside "dataslow", and ``?run=live1`` named no
    run, probe 31k N3): its parent folder's name and its own, ``runs/live1``; runs whose
    names would be the same get more of their path, up to the whole of it."""
    depth = dict.fromkeys(paths, 2)
    while True:
        labels = {p: "/".join(p.parts[-depth[p] :]).lstrip("/") or str(p) for p in paths}
        counts: dict[str, int] = {}
        for label in labels.values():
            counts[label] = counts.get(label, 0) + 1
        clashing = [p for p in paths if counts[labels[p]] > 1 and depth[p] < len(p.parts)]
        if not clashing:
            return [labels[p] for p in paths]
        for p in clashing:
            depth[p] += 1


def find_run(refs: list[RunRef], wanted: str) -> int | None:
    """Index of the run a URL's ``run=`` names: its label, or the end of one (a run's own
    folder name, ``live1``, as a link made before names had their parent), when that
    names one run only."""
    labels = [r.label for r in refs]
    if wanted in labels:
        return labels.index(wanted)
    ends = runs_ending_with(refs, wanted)
    return ends[0] if len(ends) == 1 else None


def runs_ending_with(refs: list[RunRef], wanted: str) -> list[int]:
    """Indices of the runs whose label ends with ``wanted`` (whole path parts): more than
    one makes a short ``?run=`` ambiguous, which the page says, listing them (it said
    "no run of that name" where two runs had it: probe 31l, F4)."""
    tail = "/" + wanted.strip("/")
    return [i for i, r in enumerate(refs) if ("/" + r.label).endswith(tail)]


def ambiguity(refs: list[RunRef], wanted: str) -> list[str]:
    """The labels ``wanted`` could mean, where it names no run alone and several end with
    it; empty otherwise."""
    if wanted in [r.label for r in refs]:
        return []
    ends = runs_ending_with(refs, wanted)
    return [refs[i].label for i in ends] if len(ends) > 1 else []


def recorded_status(run: Path) -> str | None:
    """The run's status as rundir reads it from its manifests (the worst node's;
    ``running`` while a launcher is alive, ``launcher_lost`` once it is gone), or None
    without a manifest."""
    return rundir.worst_status(rundir.node_run_statuses(run).values())


def is_live(ref: RunRef) -> bool:
    """A run still being written by a live launcher (of any node): the dashboard follows
    it live."""
    return "running" in rundir.node_run_statuses(ref.path).values()


def is_inside(path: Path, roots: list[Path]) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(Path(r).resolve()) for r in roots)


def confine(path: str | os.PathLike[str], roots: list[Path]) -> Path:
    """``path`` resolved (symlinks followed), or PathOutsideRoots when it leaves the roots
    or is no path at all (a NUL byte, a name too long)."""
    try:
        resolved = Path(path).resolve()
    except (ValueError, OSError) as exc:
        raise PathOutsideRoots(f"{path!r}: not a usable path ({exc})") from None
    if not is_inside(resolved, roots):
        raise PathOutsideRoots(f"{path}: outside the run roots given to the dashboard")
    return resolved


def fingerprint(run: Path) -> str:
    """Content key for the analysis cache: names, sizes and mtimes of the run's files, so
    a run that is still being written (or is replaced) is analysed again."""
    digest = hashlib.sha256()
    count = 0
    for dirpath, dirnames, filenames in os.walk(run):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            try:
                st = full.stat()
            except OSError:
                continue
            digest.update(f"{full.relative_to(run)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            count += 1
            if count >= _FINGERPRINT_MAX_FILES:
                return digest.hexdigest()
    return digest.hexdigest()


def trace_files(run: Path, roots: list[Path]) -> dict[str, Path]:
    """Downloadable raw traces of a run, by file name: ``traces/`` of a run directory or
    the trace files of a plain trace directory. Only files that stay inside the roots."""
    directory = run / rundir.TRACES_DIR if rundir.is_dir(run / rundir.TRACES_DIR) else run
    files: dict[str, Path] = {}
    for name in rundir.list_dir(directory) or ():
        p = directory / name
        if rundir.looks_like_trace(p):
            try:
                files[p.name] = confine(p, roots)
            except PathOutsideRoots:
                continue
    return files
