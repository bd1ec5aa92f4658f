"""Which runs the dashboard may show, and a content key for caching their analysis.

Everything the UI can open is discovered here from the run roots given on the command
line; a path that does not resolve inside one of those roots is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpudiag import rundir

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = (REPO / "sample_runs", Path("gpudiag_runs"))

# Profiler trace names the analysis package reads (tensorboard_trace_handler, HTA,
# torchtitan, Megatron): plain or gzipped Chrome-trace JSON.
_TRACE_NAME = re.compile(r"\.(pt\.trace\.)?json(\.gz)?$")
_NOT_TRACES = {rundir.MANIFEST, rundir.LINT, rundir.HANG_REPORT}
_FINGERPRINT_MAX_FILES = 5000


class PathOutsideRoots(ValueError):
    """A path chosen in the UI that is not inside any run root."""


@dataclass(frozen=True)
class RunRef:
    label: str  # what the UI shows: "<root name>/<run name>"
    path: Path  # resolved


def _has_trace_files(directory: Path) -> bool:
    try:
        return any(
            p.is_file() and _TRACE_NAME.search(p.name) and p.name not in _NOT_TRACES
            for p in directory.iterdir()
        )
    except OSError:
        return False


def is_run(directory: Path) -> bool:
    """A gpudiag run directory, or a directory holding profiler traces itself."""
    return directory.is_dir() and (rundir.is_run_dir(directory) or _has_trace_files(directory))


def discover_runs(roots: list[Path]) -> list[RunRef]:
    """Each root that is a run, else the runs directly inside it (sorted by name)."""
    found: list[RunRef] = []
    seen: set[Path] = set()
    for root in roots:
        root = Path(root).resolve()
        if not root.is_dir():
            continue
        if is_run(root):
            candidates = [root]
        else:
            try:
                candidates = sorted(p for p in root.iterdir() if p.is_dir() and is_run(p))
            except OSError:
                candidates = []
        for run in candidates:
            run = run.resolve()
            if run in seen or not is_inside(run, roots):
                continue
            seen.add(run)
            label = run.name if run == root else f"{root.name}/{run.name}"
            found.append(RunRef(label=label, path=run))
    return found


def is_inside(path: Path, roots: list[Path]) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(Path(r).resolve()) for r in roots)


def confine(path: str | os.PathLike[str], roots: list[Path]) -> Path:
    """``path`` resolved (symlinks followed), or PathOutsideRoots when it leaves the roots."""
    resolved = Path(path).resolve()
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
    directory = run / rundir.TRACES_DIR if (run / rundir.TRACES_DIR).is_dir() else run
    files: dict[str, Path] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return files
    for p in entries:
        if p.is_file() and _TRACE_NAME.search(p.name) and p.name not in _NOT_TRACES:
            try:
                files[p.name] = confine(p, roots)
            except PathOutsideRoots:
                continue
    return files
