"""The gpudiag run directory: the one place that knows its file names and formats.

Capture (inside the training processes and the launcher) writes through the writer
helpers here; analysis and the dashboard read through :func:`load_run`. See
docs/run-format.md for the format itself and why it is JSON Lines.

Layout (format version 1)::

    <run>/manifest.json                    launcher (node 0); atomically replaced
    <run>/manifest.node<N>.json            launchers of nodes N > 0
    <run>/lint.json                        lint result for the traced script
    <run>/hang_report.json                 only when the hang watchdog fired (node K: .node<K>.json)
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
    <run>/rank<R>/hang_request             the watchdog's request for inflight.json (control)
    <run>/rank<R>/inflight_live.json       collectives in flight for over a second (live view)
    <run>/rank<R>/last_call.json           the user collective the rank entered last (kept on an abort)
    <run>/node<N>/clock.json               the node's clock offset to node 0 (multi-node)
    <run>/node<N>/gpu_samples.jsonl        NVML samples, every local GPU
    <run>/node<N>/host_samples.jsonl       host CPU/memory samples (always; the only ones without NVML)

All times are integer nanoseconds since the Unix epoch ("trace clock": a Kineto event
at ``ts`` µs is at ``baseTimeNanoseconds + ts * 1000``).

The package, by role (each name below is re-exported here: ``rundir.<name>`` works)::

    layout    file and directory names, their paths, the status vocabulary
    text      JSON Lines encoding, file names that are not UTF-8, control characters
    files     safe, bounded reads: open_regular, read_json, read_text, list_dir
    schema    each run file's field types, the tables' columns, the Run dataclass
    write     capture's writers: JSON documents, JsonlWriter, SlotWriter, space reserves
    procs     process liveness: the launcher's pid, run_status
    read      one run file at a time: read_object, iter_jsonl, hang reports
    clock     node clock offsets and shifting instants by them
    discover  runs, ranks, nodes and traces found; a job's separately written parts
    merge     multi-node and separately launched parts merged into one run
    tables    a table's rows into a DataFrame a block at a time
    load      load_run, load_summaries: the DataFrame build
    live      live tailing: TableTail, LiveReader, JobLiveReader

lint.json's reader is :mod:`gpudiag.lint.report` (it reads through ``files``).
"""

from __future__ import annotations

from gpudiag.rundir.clock import INSTANT_COLUMNS
from gpudiag.rundir.discover import (
    find_runs,
    find_traces,
    group_node_dirs,
    is_run_dir,
    is_trace_name,
    launched_separately,
    launchers_running,
    list_nodes,
    list_ranks,
    looks_like_trace,
    node_parts,
    node_run_statuses,
    sample_run_paths,
    trace_name_stem,
)
from gpudiag.rundir.files import (
    BadInput,
    RunFormatError,
    is_dir,
    is_regular_file,
    lexists,
    list_dir,
    open_regular,
    path_stat,
    read_json,
    read_problem,
    read_text,
)
from gpudiag.rundir.layout import (
    BENCH,
    CLOCK,
    COLLECTIVE_TIMES,
    COLLECTIVES,
    DDP_STATS,
    ENDED_WHILE_FINISHING,
    FAILED_STATUSES,
    FORMAT_VERSION,
    GPU_SAMPLES,
    HANG_REPORT,
    HANG_REQUEST,
    HOST_SAMPLES,
    INFLIGHT,
    LAST_CALL,
    LAST_CALL_BYTES,
    LAUNCHER_SIGNAL,
    LINT,
    LIVE_INFLIGHT,
    LIVE_INFLIGHT_AGE_S,
    MANIFEST,
    MAX_WORLD_SIZE,
    RANK_INFO,
    RANK_STATUSES,
    RANK_TABLES,
    REGIONS,
    RESERVE,
    RUN_STATUSES,
    STACKS,
    STATUS,
    STATUS_FINISHING,
    STEPS,
    SUMMARY,
    TRACES_DIR,
    hang_report_path,
    hang_report_paths,
    is_collective_timeout,
    is_failed,
    is_peer_error,
    manifest_path,
    node_dir,
    rank_dir,
    reserve_path,
    table_path,
    trace_path,
    worst_status,
)
from gpudiag.rundir.live import (
    LIVE_LOST_STATES,
    LIVE_RANK_TABLES,
    LIVE_TAIL_BYTES,
    JobLiveReader,
    LiveBatch,
    LiveReader,
    TableTail,
    merge_live_batches,
    open_live,
)
from gpudiag.rundir.load import load_run, load_summaries
from gpudiag.rundir.merge import (
    EARLY_EXIT,
    LAUNCH_ERROR,
    early_exit_failure,
    left_early,
    merge_manifests,
    signalled_node,
)
from gpudiag.rundir.procs import (
    LAUNCHER_HEARTBEAT_S,
    LAUNCHER_STALE_S,
    boot_id,
    launcher_gone,
    launcher_pid_problem,
    process_start_ticks,
    run_status,
)
from gpudiag.rundir.read import (
    MAX_LINE_BYTES,
    final_status_written,
    iter_jsonl,
    merge_hang_reports,
    read_last_call,
    read_object,
)
from gpudiag.rundir.schema import STEP_COLUMNS, Run
from gpudiag.rundir.tables import (
    release_free_memory,
)
from gpudiag.rundir.text import fs_safe, fs_text, has_control_chars, one_line, without_control_chars
from gpudiag.rundir.write import (
    RANK_RESERVE_BYTES,
    STATUS_RESERVE_BYTES,
    JsonlWriter,
    SlotWriter,
    adopt_reserve,
    create_unique_dir,
    deleted_while_written,
    file_size_limit,
    handed_reserve_path,
    note_problem,
    note_write_problem,
    open_last_call,
    open_node_table,
    open_rank_table,
    release_space,
    reserve_for_ranks,
    reserve_space,
    shrink_reserve,
    why_unwritable,
    write_json_atomic,
    write_json_exclusive,
    write_problems,
    write_rank_json,
)

__all__ = [
    "BENCH",
    "BadInput",
    "CLOCK",
    "COLLECTIVES",
    "COLLECTIVE_TIMES",
    "DDP_STATS",
    "EARLY_EXIT",
    "LAUNCH_ERROR",
    "ENDED_WHILE_FINISHING",
    "FAILED_STATUSES",
    "FORMAT_VERSION",
    "GPU_SAMPLES",
    "HANG_REPORT",
    "LAUNCHER_SIGNAL",
    "HANG_REQUEST",
    "HOST_SAMPLES",
    "INFLIGHT",
    "INSTANT_COLUMNS",
    "JobLiveReader",
    "JsonlWriter",
    "LAST_CALL",
    "LAST_CALL_BYTES",
    "LAUNCHER_HEARTBEAT_S",
    "LAUNCHER_STALE_S",
    "LINT",
    "LIVE_INFLIGHT",
    "LIVE_INFLIGHT_AGE_S",
    "LIVE_LOST_STATES",
    "LIVE_RANK_TABLES",
    "LIVE_TAIL_BYTES",
    "LiveBatch",
    "LiveReader",
    "MANIFEST",
    "MAX_WORLD_SIZE",
    "MAX_LINE_BYTES",
    "RANK_INFO",
    "RANK_RESERVE_BYTES",
    "RANK_STATUSES",
    "RANK_TABLES",
    "REGIONS",
    "RESERVE",
    "RUN_STATUSES",
    "Run",
    "RunFormatError",
    "STACKS",
    "STATUS",
    "STATUS_FINISHING",
    "STATUS_RESERVE_BYTES",
    "STEPS",
    "STEP_COLUMNS",
    "SUMMARY",
    "SlotWriter",
    "TRACES_DIR",
    "TableTail",
    "adopt_reserve",
    "create_unique_dir",
    "deleted_while_written",
    "early_exit_failure",
    "file_size_limit",
    "final_status_written",
    "find_runs",
    "find_traces",
    "fs_safe",
    "fs_text",
    "group_node_dirs",
    "launchers_running",
    "handed_reserve_path",
    "hang_report_path",
    "hang_report_paths",
    "has_control_chars",
    "is_collective_timeout",
    "is_dir",
    "is_failed",
    "is_peer_error",
    "is_regular_file",
    "is_run_dir",
    "is_trace_name",
    "iter_jsonl",
    "launched_separately",
    "launcher_gone",
    "launcher_pid_problem",
    "boot_id",
    "left_early",
    "lexists",
    "list_dir",
    "list_nodes",
    "list_ranks",
    "load_run",
    "load_summaries",
    "looks_like_trace",
    "manifest_path",
    "merge_hang_reports",
    "merge_live_batches",
    "merge_manifests",
    "node_dir",
    "node_parts",
    "node_run_statuses",
    "note_problem",
    "note_write_problem",
    "one_line",
    "signalled_node",
    "open_last_call",
    "open_live",
    "open_node_table",
    "open_rank_table",
    "open_regular",
    "path_stat",
    "rank_dir",
    "read_json",
    "read_last_call",
    "read_object",
    "read_problem",
    "read_text",
    "release_free_memory",
    "release_space",
    "reserve_for_ranks",
    "reserve_path",
    "reserve_space",
    "process_start_ticks",
    "run_status",
    "sample_run_paths",
    "shrink_reserve",
    "table_path",
    "trace_name_stem",
    "trace_path",
    "why_unwritable",
    "without_control_chars",
    "worst_status",
    "write_json_atomic",
    "write_json_exclusive",
    "write_problems",
    "write_rank_json",
]
