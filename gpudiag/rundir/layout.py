"""The run directory's names: its files, tables and directories, the paths built from
them, and the status vocabulary its files use. See :mod:`gpudiag.rundir` for the layout."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpudiag.rundir.files import is_dir, list_dir

FORMAT_VERSION = 1

MANIFEST = "manifest.json"
LINT = "lint.json"
HANG_REPORT = "hang_report.json"
CLOCK = "clock.json"  # node<N>/clock.json: the node's clock offset to node 0
# node<N>/launcher_signal.json: the signal node N's launcher received and forwarded to
# its ranks (a Ctrl-C or `kill` there), written before forwarding it: another node's
# launcher reads why that node's ranks ended
LAUNCHER_SIGNAL = "launcher_signal.json"
TRACES_DIR = "traces"
# The largest world size a run file is believed: a count read from a file sizes lists and
# loops in the readers, so a damaged one (10**12) is taken as unknown, never allocated.
MAX_WORLD_SIZE = 1 << 20

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
# A status.json written when the rank's code ended, before gpudiag's own finishing (trace
# export, tables), carries STATUS_FINISHING true; the final one replaces it. Left in place,
# the rank ended (killed, crashed) while it finished: ENDED_WHILE_FINISHING says so.
STATUS_FINISHING = "finishing"
ENDED_WHILE_FINISHING = (
    "the rank ended while gpudiag was writing its record (trace, tables, summary): "
    "they may be incomplete"
)
SUMMARY = "summary.json"
STACKS = "stacks.txt"
BENCH = "bench.json"  # gpudiag bench: the comparison table, in the bench folder and each run
INFLIGHT = "inflight.json"  # in-flight collectives + FR dump, written on a hang request
HANG_REQUEST = "hang_request"  # control file: the watchdog asks a rank for inflight.json
# Collectives this rank entered over LIVE_INFLIGHT_AGE_S ago and has not left, rewritten
# by the rank's background thread at most every second and only when that set changes
# (so a healthy job writes it about once): what `gpudiag watch` shows as stuck.
LIVE_INFLIGHT = "inflight_live.json"
LAST_CALL = "last_call.json"
LAST_CALL_BYTES = 1024  # one fixed-size slot, rewritten in place at every call
LIVE_INFLIGHT_AGE_S = 1.0

# The run's status (manifest ``status``), the one list. ``running`` is what the launcher
# writes at start; ``launcher_lost`` is never written: readers report it for a run still
# marked running whose launcher is gone (see :func:`run_status`).
RUN_STATUSES = ("running", "ok", "failed", "interrupted", "hang", "launcher_lost")
RANK_STATUSES = ("ok", "failed", "interrupted", "hang")  # status.json and summary.json ``status``
# The statuses that mean a rank (or the run) failed by itself: an exception in the script,
# a non-zero exit, or a rank that died without writing status.json (the launcher marks
# the run ``failed``). ``interrupted`` (a signal from outside: Ctrl-C, SIGTERM, a kill
# after a hang) and ``hang`` (its own finding, from hang_report.json) are not failures of
# a rank; ``launcher_lost`` says nothing about the ranks.
FAILED_STATUSES = frozenset({"failed"})


def is_failed(status: object) -> bool:
    """Whether a manifest, status.json or summary.json ``status`` value means failed."""
    return isinstance(status, str) and status.strip().lower() in FAILED_STATUSES


# Errors a rank gets when a peer went away: consequences, not causes.
PEER_ERROR_PATTERNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "remote process exited",
    "remote worker crash",
    "socket timeout",
    "econnreset",
    "communicator was aborted",
    "gloo connectfullmesh failed",
    "recv failed",
    "send failed",
    "read error",
    "write error",
)


def is_peer_error(status: Mapping[str, object]) -> bool:
    """Whether a status.json (or manifest ``failure``) says the rank failed because a
    peer went away (its collective's connection closed), not by itself."""
    text = f"{status.get('exc_type') or ''} {status.get('message') or ''}".lower()
    return any(p in text for p in PEER_ERROR_PATTERNS)


# Errors a rank gets when a collective waited longer than the process group's timeout
# (gloo, NCCL's watchdog, monitored_barrier): a consequence when a peer never arrived.
COLLECTIVE_TIMEOUT_PATTERNS = (
    "timed out waiting",
    "watchdog caught collective operation timeout",
    "before timing out",
    "failed to pass monitoredbarrier",
)


def is_collective_timeout(status: Mapping[str, object]) -> bool:
    """Whether a status.json says the rank's collective hit its process group's timeout."""
    text = f"{status.get('message') or ''}".lower()
    return any(p in text for p in COLLECTIVE_TIMEOUT_PATTERNS)


RESERVE = ".gpudiag_reserve"  # space kept for the last writes (see reserve_space)

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


def hang_report_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    """Each node's hang watchdog writes its own report (node 0: hang_report.json)."""
    if node == 0:
        return Path(run) / HANG_REPORT
    return Path(run) / f"hang_report.node{node}.json"


_NODE_HANG_REPORT_RE = re.compile(r"hang_report\.node([1-9]\d{0,5})\.json")


def hang_report_paths(run: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(node, path) of every hang report in a run directory, node 0 first."""
    run = Path(run)
    found = []
    for name in list_dir(run) or ():
        match = _NODE_HANG_REPORT_RE.fullmatch(name)
        node = 0 if name == HANG_REPORT else int(match.group(1)) if match else None
        if node is not None and not is_dir(run / name):  # the reader says what else it is
            found.append((node, run / name))
    return sorted(found)


def reserve_path(run: str | os.PathLike[str], node: int = 0) -> Path:
    return Path(run) / (RESERVE if node == 0 else f"{RESERVE}.node{node}")


def worst_status(statuses: Iterable[Any]) -> str | None:
    """A multi-node job's status from its nodes' (a job whose one node failed failed)."""
    worst = _worst_status(statuses)
    return worst if isinstance(worst, str) else None


# --------------------------------------------------------------------------- nodes
# A manifest's node, and the worst of its nodes' statuses (merge.py, live.py, discover.py).

# Worst first: a job whose one node failed failed.
_STATUS_ORDER = ("failed", "hang", "interrupted", "launcher_lost", "running", "ok")


def manifest_node(manifest: Mapping[str, Any]) -> int:
    node = manifest.get("node_rank")
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else 0


def _worst_status(statuses: Iterable[Any]) -> Any:
    known = [s for s in statuses if s in _STATUS_ORDER]
    return min(known, key=_STATUS_ORDER.index) if known else None
