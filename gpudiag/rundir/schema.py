"""What a run file holds: the type of each field (checked on read), the columns of each
table, and the :class:`Run` a run directory loads as."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.rundir.files import bad_input
from gpudiag.rundir.layout import (
    COLLECTIVE_TIMES,
    COLLECTIVES,
    DDP_STATS,
    GPU_SAMPLES,
    HANG_REPORT,
    HOST_SAMPLES,
    MANIFEST,
    RANK_INFO,
    REGIONS,
    STATUS,
    STATUS_FINISHING,
    STEPS,
    SUMMARY,
)

if TYPE_CHECKING:
    from gpudiag.lint.report import LintReport


MAX_DEPTH = 32  # nesting a run file never needs; deeper is refused (RecursionError later)
_INT64 = (-(2**63), 2**63 - 1)
MAX_CALL_BYTES = 2**50  # one collective of a PiB: no job moves that in one call


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _is_int(v: Any) -> bool:
    return type(v) is int and _INT64[0] <= v <= _INT64[1]


def _is_num(v: Any) -> bool:
    return (type(v) is int and _INT64[0] <= v <= _INT64[1]) or (
        type(v) is float and v == v and abs(v) != float("inf")
    )


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


# what each field of a run file must be (None is always allowed: the field is unknown)
_CHECKS: dict[str, tuple[Any, str]] = {
    "int": (_is_int, "an integer"),
    "num": (_is_num, "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "key": (lambda v: isinstance(v, str) or _is_int(v), "a string or an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "ints": (_is_int_list, "a list of integers"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "pid": (lambda v: type(v) is int and 0 < v < 2**31, "a process id"),
    # values a recording never holds (probe 28d: a step of -5, a call of -10**12 bytes
    # made a false desync the first finding, a rank's every step inverted moved a cost
    # from 2.88 to 61.77 ms a step, each without a word)
    "count": (lambda v: _is_int(v) and v >= 0, "a whole number, 0 or more"),
    "dur": (lambda v: _is_num(v) and v >= 0, "a duration, 0 or more"),
    "bytes": (lambda v: _is_num(v) and 0 <= v <= MAX_CALL_BYTES, "a size of 0 to 2**50 bytes"),
}

# the NVML sample's numbers: the gpu table's schema and its columns
_GPU_NUMBERS = (
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
SCHEMAS: dict[str, dict[str, str]] = {
    STEPS: {
        "step": "count",
        "start_ns": "int",
        "end_ns": "int",
        "data_ns": "dur",
        "optimizer_ns": "dur",
        "cpu_ns": "dur",
        "runq_ns": "dur",
        "threads_runq_ns": "dur",
        "source": "str",
    },
    COLLECTIVES: {
        "pg_name": "key",
        "pg_desc": "str",
        "pg_size": "count",
        "pg_ranks": "ints",
        "seq": "count",
        "op": "str",
        "in_bytes": "bytes",
        "out_bytes": "bytes",
        "dtype": "str",
        "in_sizes": "list",
        "out_sizes": "list",
        "enqueue_ns": "int",
        "start_ns": "int",
        "end_ns": "int",
        "gpu_duration_ns": "dur",
        "step": "count",
        "record_id": "int",
        "source": "str",
    },
    COLLECTIVE_TIMES: {
        "pg_name": "key",
        "seq": "count",
        "start_ns": "int",
        "end_ns": "int",
        "source": "str",
    },
    REGIONS: {"name": "str", "start_ns": "int", "end_ns": "int", "step": "count"},
    DDP_STATS: {"step": "count"},
    GPU_SAMPLES: {
        "t_ns": "int",
        "gpu": "int",
        "uuid": "str",
        **{k: "num" for k in _GPU_NUMBERS},
    },
    HOST_SAMPLES: {
        "t_ns": "int",
        **{
            k: "num"
            for k in ("cpu_percent", "mem_used", "mem_total", "proc_cpu_percent", "proc_rss")
        },
    },
    MANIFEST: {
        "format_version": "int",
        "world_size": "int",
        "status": "str",
        "exit_code": "int",
        "failure": "dict",
        "failed_ranks": "ints",
        "backend": "str",
        "script": "str",
        "module": "str",
        "argv": "list",
        "synthetic": "bool",
        "launcher": "dict",
        "incomplete": "list",
        "traced_ranks": "ints",
        "untraced_ranks": "ints",
        "init_method": "str",
        "start_ns": "int",
        "end_ns": "int",
        "node_rank": "int",
        "job_returncode": "int",
        "steps_completed": "dict",
        "missing_status_ranks": "ints",
        "launcher_signal": "str",
        "hosts": "list",
        "launch": "dict",
        "clock": "dict",
        "versions": "dict",
        "env": "dict",
        "nnodes": "key",
        "nproc_per_node": "key",
        "profile": "dict",
    },
    STATUS: {
        "rank": "int",
        "status": "str",
        "state": "str",
        "exit_code": "int",
        "exc_type": "str",
        "message": "str",
        "error": "str",
        "traceback": "str",
        "steps_completed": "int",
        "start_ns": "int",
        "end_ns": "int",
        "profile_error": "str",
        STATUS_FINISHING: "bool",
    },
    RANK_INFO: {
        "rank": "int",
        "local_rank": "int",
        "world_size": "int",
        "node_rank": "int",
        "hostname": "str",
        "pid": "int",
        "backend": "str",
        "device": "str",
        "start_ns": "int",
        "rank_source": "str",
        "started_by": "str",
        "init_method": "str",
        "parent_pid": "int",
    },
    SUMMARY: {"format_version": "int", "rank": "int", "status": "str", "steps": "dict"},
    HANG_REPORT: {
        "detected_after_s": "num",
        "ranks": "dict",
        "stuck_ranks": "ints",
        "ranks_not_in_collective": "ints",
        "desync": "dict",
        "verdict": "str",
    },
    "launcher": {
        "pid": "pid",
        "hostname": "str",
        "start_time": "num",
        "start_ticks": "count",
        "boot_id": "str",
        "heartbeat_s": "num",
    },
    "failure": {
        "rank": "int",
        "exit_code": "int",
        "exc_type": "str",
        "message": "str",
        "traceback": "str",
    },
    "hang_rank": {"last_step": "int", "top_frame": "str", "inflight": "list"},
    "inflight": {"seq": "int", "op": "str", "pg_name": "key", "bytes": "bytes", "callsite": "str"},
    "desync": {"pg_name": "key", "seq": "int", "calls": "dict", "verdict": "str"},
    "call": {"op": "str", "callsite": "str", "seq": "int", "pg_name": "key"},
}


_NUMBER_KINDS = ("int", "num", "key", "count", "dur", "bytes")


def _digits(value: int) -> int:
    return len(str(abs(value))) if abs(value) < 10**4000 else 4000


# the tables whose rows are intervals: a row that ends before it starts is no interval
_INTERVALS = {STEPS, COLLECTIVES, COLLECTIVE_TIMES, REGIONS}


def _bad_fields(row: dict, schema: str) -> list[str]:
    problems = []
    start, end = row.get("start_ns"), row.get("end_ns")
    if schema in _INTERVALS and isinstance(start, int) and isinstance(end, int) and end < start:
        problems.append("'end_ns' is before 'start_ns'")
    for key, kind in SCHEMAS[schema].items():
        value = row.get(key)
        if value is not None:
            check, what = _CHECKS[kind]
            if type(value) is int and kind in _NUMBER_KINDS and not _is_int(value):
                problems.append(f"{key!r} is {_digits(value)} digits long: no 64-bit integer")
            elif not check(value):
                problems.append(f"{key!r} must be {what}")
    return problems


def check_fields(
    obj: dict, schema: str, path: Path | str, warnings: list[str] | None
) -> dict[str, Any]:
    """``obj`` without the fields of the wrong type, one warning naming the file."""
    problems = _bad_fields(obj, schema)
    if not problems:
        return obj
    bad_input(
        warnings, f"{path}: ignored field(s) of the wrong type or value: {'; '.join(problems)}"
    )
    names = {p.split("'")[1] for p in problems}
    return {k: v for k, v in obj.items() if k not in names}


def _int_keyed(
    value: Any, schema: str, path: Path | str, warnings: list[str] | None, what: str
) -> dict[str, dict]:
    """A {rank: object} mapping (JSON keys are strings): non-integer keys and
    non-object values are dropped with a warning."""
    out: dict[str, dict] = {}
    dropped = []
    for key, item in (value or {}).items():
        if isinstance(item, dict) and re.fullmatch(r"\d{1,9}", str(key)):
            out[str(int(key))] = check_fields(item, schema, f"{path} ({what} {key})", warnings)
        else:
            dropped.append(str(key)[:20])
    if dropped:
        bad_input(warnings, f"{path}: ignored {what} entries with a bad rank key: {dropped[:5]}")
    return out


def check_hang_report(report: dict, path: Path, warnings: list[str] | None) -> dict[str, Any]:
    report = check_fields(report, HANG_REPORT, path, warnings)
    if isinstance(report.get("ranks"), dict):
        ranks = _int_keyed(report["ranks"], "hang_rank", path, warnings, "ranks")
        for key, state in ranks.items():
            if isinstance(state.get("inflight"), list):
                calls = [c for c in state["inflight"] if isinstance(c, dict)]
                state["inflight"] = [
                    check_fields(c, "inflight", f"{path} (rank {key} inflight)", warnings)
                    for c in calls
                ]
        report["ranks"] = ranks
    if isinstance(report.get("desync"), dict):
        desync = check_fields(report["desync"], "desync", f"{path} (desync)", warnings)
        if isinstance(desync.get("calls"), dict):
            desync["calls"] = _int_keyed(desync["calls"], "call", path, warnings, "desync calls")
        report["desync"] = desync
    return report


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
    lint: LintReport | None = None
    hang_report: dict[str, Any] | None = None
    stacks: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    parts: list[Path] = field(default_factory=list)  # per-node directories merged
    # rank -> ns added to its times (its node's clock offset to node 0; applied to the
    # tables here, to its trace by the analysis)
    clock_offsets: dict[int, int] = field(default_factory=dict)

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
    def rank_nodes(self) -> dict[int, int]:
        """rank -> node rank, from each rank's rank_info.json (ranks without one are
        absent)."""
        return {
            r: n
            for r, info in self.rank_info.items()
            if isinstance(n := info.get("node_rank"), int) and not isinstance(n, bool)
        }

    @property
    def world_size(self) -> int | None:
        ws = self.manifest.get("world_size")
        if ws:
            return int(ws)
        sizes = [
            int(v)
            for i in self.rank_info.values()
            if isinstance(v := i.get("world_size"), int) and v > 0
        ]
        return max(sizes) if sizes else None


STEP_COLUMNS = (
    "rank",
    "step",
    "start_ns",
    "end_ns",
    "data_ns",
    "optimizer_ns",
    "cpu_ns",
    "runq_ns",
    "threads_runq_ns",
    "source",
)
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
    "gpu_duration_ns",
    "step",
    "record_id",
    "source",
)
REGION_COLUMNS = ("rank", "name", "start_ns", "end_ns", "step")
GPU_COLUMNS = ("node", "t_ns", "gpu", "uuid", *_GPU_NUMBERS)
HOST_COLUMNS = (
    "node",
    "t_ns",
    "cpu_percent",
    "mem_used",
    "mem_total",
    "proc_cpu_percent",
    "proc_rss",
)
