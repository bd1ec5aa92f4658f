"""The run directory a node's launcher writes: its name, the claim on it (refused when it
holds another run), the space kept for the run's end, and the manifest writes.

Moved out of launcher.py (issue 33). Capture-side: imports nothing of
lint/analysis/report/cli.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from gpudiag import rundir

# Space kept in the run directory until the end, so that the final manifest can be
# written on a disk the job filled (see rundir.reserve_space).
RESERVE_BYTES = 256 * 1024


def default_out(target: dict[str, str]) -> Path:
    """``gpudiag_runs/<script>-<time>``; :func:`rundir.create_unique_dir` adds a suffix
    when another run started in the same second took that name."""
    stem = Path(target["script"]).stem if "script" in target else target["module"].split(".")[-1]
    # a script named with a newline: the name is ours to choose (torch's exporter cannot
    # write under such a path, issue 28 probe)
    stem = rundir.without_control_chars(stem)
    return Path("gpudiag_runs") / f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"


def claim_run_dir(
    out: str | None, target: dict[str, str], node_rank: int | None
) -> tuple[Path, str | None]:
    """(run directory, why it cannot be used or None). The default directory is created
    atomically under a unique name; a given ``--out`` that already holds a run is
    refused (the new rows would be appended to the old tables). Creating the manifest
    (:func:`rundir.write_json_exclusive`) is the final claim."""
    if out is None:
        return _claim_default(default_out(target))
    run_dir = Path(out).resolve()
    # node_rank None: assigned by the rendezvous later; its manifest claims it then
    if node_rank is not None and (
        rundir.manifest_path(run_dir, node_rank).exists()
        or (node_rank == 0 and _holds_other_run(run_dir))
    ):
        return run_dir, "already holds a gpudiag run; choose another --out or remove it"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return run_dir, _cannot_create(exc)
    if not os.access(run_dir, os.W_OK):
        return run_dir, "not writable"
    return run_dir, None


def _claim_default(name: Path) -> tuple[Path, str | None]:
    """The default run directory under the working folder, or under the temporary folder
    where the working folder takes no new directory (a read-only root filesystem, /sys):
    python would run the script there, so gpudiag does not refuse it (probe 28f)."""
    try:
        return rundir.create_unique_dir(name.resolve()), None
    except OSError as exc:
        try:
            return rundir.create_unique_dir(Path(tempfile.gettempdir()).resolve() / name), None
        except OSError:
            return name.resolve(), _cannot_create(exc)


def outside_working_folder(run_dir: Path) -> bool:
    """The default run directory went elsewhere than the working folder."""
    try:
        return not run_dir.is_relative_to(Path.cwd().resolve())
    except OSError:
        return True


def _holds_other_run(run_dir: Path) -> bool:
    """A run directory node 0 must not write into: a run, unless what is there so far
    comes from the other nodes of this job (their manifest.node<K>.json came first)."""
    if not rundir.is_run_dir(run_dir):
        return False
    return not any(run_dir.glob("manifest.node*.json"))


# Files (inodes) a run needs: each rank's directory, tables, status, summary and trace;
# each node's manifest, samples, reserves and lint report (counted on recorded runs: 12-16
# per rank, 6-9 per node), with room to spare.
INODES_PER_RANK = 24
INODES_PER_NODE = 16


def inodes_short(run_dir: Path, local_ranks: int) -> str | None:
    """One line when the run directory's filesystem has too few free files (inodes) for
    the run, else None: a tmpfs with free bytes and no free inode let rank 1 create
    nothing, not even its directory, and it was recorded as started by another launcher
    (issue 28 probe, class 8). Filesystems that do not count inodes (0 total) pass."""
    try:
        stats = os.statvfs(run_dir)
    except OSError:
        return None
    need = INODES_PER_NODE + INODES_PER_RANK * max(local_ranks, 1)
    if stats.f_files == 0 or stats.f_favail >= need:
        return None
    return (
        f"not enough free files (inodes) to record the run ({stats.f_favail} free; "
        f"a run of {local_ranks} local rank(s) needs about {need}): free some or choose "
        "another --out"
    )


# Below this much free space after the reserves, the run directory's filesystem is one a
# job can fill: gpudiag's records (the reserves, the tables, a profiler trace of several
# MiB per rank on a GPU) then take room the job's own checkpoint may need (probe 28i, F2).
LOW_SPACE_BYTES = 256 * 1024 * 1024


def low_space_warning(run_dir: Path) -> str | None:
    """One line when the run directory's filesystem is nearly full, else None. The job
    runs either way: gpudiag cannot know what the job will write there."""
    try:
        stats = os.statvfs(run_dir)
    except OSError:
        return None
    free = stats.f_bavail * stats.f_frsize
    if stats.f_blocks == 0 or free >= LOW_SPACE_BYTES:
        return None
    return (
        f"{run_dir}: {free / 2**20:.1f} MiB free on its filesystem; gpudiag's records "
        "(the space kept for the run's end, the tables, the profiler's trace) take room "
        "there that the job may need for its own files: --out on another filesystem "
        "keeps them apart"
    )


def _no_room(run_dir: Path) -> str:
    """One line: the run directory cannot hold even the record of the run's end."""
    try:
        free = os.statvfs(run_dir).f_bavail * os.statvfs(run_dir).f_frsize
        have = f"{free // 1024} KiB free"
    except OSError:
        have = "its free space unknown"
    return (
        f"not enough free space to record the run ({have}; gpudiag keeps "
        f"{RESERVE_BYTES // 1024} KiB for the run's end and "
        f"{rundir.RANK_RESERVE_BYTES // 1024} KiB for each rank's, and their tables need more): "
        "free some space or choose another --out"
    )


def _open_dir(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def _deleted(fd: int | None) -> bool:
    """Whether the directory open as ``fd`` was removed (``rm -rf`` of the run
    directory while the job wrote it: its files are gone, a new one may stand in its
    place); closes ``fd``."""
    if fd is None:
        return False
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False
    finally:
        os.close(fd)


def _cannot_create(exc: OSError) -> str:
    return f"cannot create the run directory ({exc.strerror or exc})"


def _write_manifest(path: Path, manifest: dict[str, Any], first: bool) -> bool:
    """Write the manifest; never raises for I/O (the job goes on). The first write is
    exclusive: FileExistsError (another launcher owns the directory) is raised."""
    try:
        if first:
            rundir.write_json_exclusive(path, manifest)
        else:
            rundir.write_json_atomic(path, manifest)
        return True
    except FileExistsError:
        if first:
            raise
        return False
    except OSError as exc:
        rundir.note_write_problem(path, exc, "manifest")
        return False
