"""Every collective of the run, on every rank (runs inside the training process).

Three sources, joined on (process-group name, sequence number):

- PyTorch's Flight Recorder (FR) sees every collective, DDP's C++ bucket all-reduces
  included, gloo and NCCL. It keeps two rings: NCCL's (``_dump_nccl_trace_json``, CUDA
  builds only) and the generic one of gloo and other backends (``_dump_fr_trace_json``).
  Both are dumped as JSON (never pickle) between steps and at close; new entries become
  ``collectives.jsonl`` rows. Gaps in a ring's ``record_id`` mean it overflowed between
  two dumps; they are counted and written as ``lost`` rows.
- On gloo FR has no start/end times, so completion stamps come from a DDP comm hook
  (wrapping ``default_hooks.allreduce_hook``) and from patched ``torch.distributed``
  collectives. They go to ``collective_times.jsonl``; ``rundir.load_run`` merges them.
- The same wrappers keep the collectives this rank entered and has not left, for the
  hang report (:mod:`gpudiag.capture.hangdump`).
"""

from __future__ import annotations

import bisect
import functools
import inspect
import math
import os
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from gpudiag import rundir
from gpudiag.capture import ddp
from gpudiag.capture.callsite import library_callsite, user_callsite

# The ring's size. A dump serialises every entry the ring holds, ~7 us each (pickle,
# below; 13-15 us as JSON), on the training thread, and the live view's lagging window
# trails the newest step by the time between two dumps, at most 400 times a dump's own
# time (_DUMP_COST_SHARE): a full ring of 2000 (~30 ms as JSON) was dumped every 10 s and
# the window trailed by ~100 steps on a 15-steps/s job (probe 31k, D7); a ring of 512
# (~4 ms) is dumped every ~1.5 s. It still holds every collective of a step of up to 384
# (the fill below; dumped at every step end then); a job issuing more per step loses the
# oldest (written as "lost" rows): set TORCH_FR_BUFFER_SIZE (the user's size wins).
FR_BUFFER_SIZE = 512
# Dump when the ring may hold this share of new entries. A dump serialises the whole
# ring, so its cost per new entry is 1/_DUMP_FILL times the per-entry cost; the margin
# absorbs steps that issue more collectives than the ones measured so far.
_DUMP_FILL = 0.75
# A dump costs ~20 µs per entry in the ring (JSON built in C++, parsed here), full or
# not: capped at 100 steps, a job with 2 bucket all-reduces per step dumped a full ring
# of 2000 every 100 steps (~0.4 ms per step, 2.7 % of a 16 ms step). The fill and the
# age limit below decide; this cap only bounds the interval the first steps measured.
_MAX_DUMP_EVERY = 2000
_TIMES_FLUSH_ROWS = 256
_TIMES_FLUSH_NS = 1_000_000_000
# Dump at least this often too (at a step end), so `gpudiag watch` sees arrivals within
# seconds on jobs with slow steps: a full ring costs 28-42 ms, <= 0.4 % at this age.
_DUMP_MAX_AGE_NS = 10_000_000_000
# ... and more often while a dump is cheap: every 400 times the last dump's own time (its
# cost at most 0.25 % of the wall time: the dump runs on the training thread at a step's
# end, so its cost is the job's), never more often than once a second. With the
# 10 s age alone a 13-steps/s job's live lagging window trailed the newest step by ~120
# steps (probe 31j, D7); a ring of a few hundred entries dumps in a few ms, every ~1-2 s.
_DUMP_MIN_AGE_NS = 1_000_000_000
_DUMP_COST_SHARE = 0.0025


def dump_age_ns(last_dump_ns: int | None) -> int:
    """How long after a dump the next one is due at the latest, from the last dump's
    duration (``None``: none yet, the floor)."""
    if last_dump_ns is None:
        return _DUMP_MIN_AGE_NS
    return int(min(_DUMP_MAX_AGE_NS, max(_DUMP_MIN_AGE_NS, last_dump_ns / _DUMP_COST_SHARE)))


_FR_DTYPE_BYTES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}

# torch.distributed functions whose calls are timed and tracked while in flight.
_PATCHED_OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "all_reduce_coalesced",
)

# ops whose second argument is the input (the first is the output)
_INPUT_SECOND = frozenset(
    ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
     "all_to_all", "all_to_all_single")
)  # fmt: skip

_ACTIVE: CollectiveRecorder | None = None
_WRAPPER_TLS = threading.local()


def active_recorder() -> CollectiveRecorder | None:
    """The recorder installed in this process (the hang dump reads it)."""
    return _ACTIVE


def worker_env() -> dict[str, str]:
    """Environment the launcher sets for every worker before torch.distributed starts."""
    env = {
        # NCCL only (absent in CPU builds): FR then has start/end times.
        "TORCH_NCCL_ENABLE_TIMING": os.environ.get("TORCH_NCCL_ENABLE_TIMING", "1"),
    }
    if _fr_ring_env() is None:  # the user's own size (either spelling) wins
        # torch before 2.7 reads only the NCCL spelling; later ones warn on every rank
        # that it is deprecated
        name = "TORCH_FR_BUFFER_SIZE" if _torch_at_least(2, 7) else "TORCH_NCCL_TRACE_BUFFER_SIZE"
        env[name] = str(FR_BUFFER_SIZE)
    return env


def _torch_at_least(major: int, minor: int) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = version("torch").split(".")[:2]
        return (int(parts[0]), int(parts[1].split("+")[0])) >= (major, minor)
    except (PackageNotFoundError, ValueError, IndexError):
        return True


def _fr_ring_env() -> str | None:
    return os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")


# --------------------------------------------------------------------------- FR rows


def normalise_op(profiling_name: str) -> str:
    """``"gloo:all_reduce"`` / ``"nccl:all_reduce"`` -> ``"all_reduce"``."""
    return profiling_name.split(":", 1)[-1] if profiling_name else ""


def tensor_bytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        total += math.prod(shape) * _FR_DTYPE_BYTES.get(dtype, ("", 0))[1]
    return total


def _dtype_name(dtypes: list[str]) -> str | None:
    if not dtypes:
        return None
    return _FR_DTYPE_BYTES.get(dtypes[0], (dtypes[0].lower(), 0))[0]


def _shifted(t_ns: Any) -> Any:
    """An FR stamp (C++ clock, 0 = unknown) with the test clock shift (clock.py)."""
    if not t_ns:
        return None
    from gpudiag.capture.clock import test_shift_ns

    return t_ns + test_shift_ns() if isinstance(t_ns, int) else t_ns


def fr_entry_to_row(entry: dict[str, Any], pg_info: dict[str, tuple[int, list[int]]]) -> dict:
    """One FR JSON entry as a ``collectives.jsonl`` row (without ``step``)."""
    pg_name, pg_desc = (list(entry.get("process_group") or ["", ""]) + ["", ""])[:2]
    size, ranks = pg_info.get(pg_name, (None, None))
    is_p2p = bool(entry.get("is_p2p"))
    in_sizes = entry.get("input_sizes") or []
    out_sizes = entry.get("output_sizes") or []
    row = {
        "pg_name": pg_name,
        "pg_desc": pg_desc,
        "pg_size": size,
        "pg_ranks": ranks,
        "seq": None if is_p2p else entry.get("collective_seq_id"),
        "op": normalise_op(entry.get("profiling_name", "")),
        "in_bytes": tensor_bytes(in_sizes, entry.get("input_dtypes") or []),
        "out_bytes": tensor_bytes(out_sizes, entry.get("output_dtypes") or []),
        "dtype": _dtype_name(entry.get("input_dtypes") or entry.get("output_dtypes") or []),
        "in_sizes": in_sizes,
        "out_sizes": out_sizes,
        "enqueue_ns": _shifted(entry.get("time_created_ns")),
        # FR's "discovered" stamps are when its watchdog thread polled the call, not when
        # it ran (seen on an H200: start and end 0.5 us apart, 93 ms after the enqueue):
        # no start or end. With TORCH_NCCL_ENABLE_TIMING, duration_ms is the GPU time.
        "start_ns": None,
        "end_ns": None,
        "gpu_duration_ns": _duration_ns(entry.get("duration_ms")),
        "record_id": entry.get("record_id"),
        "source": "flight_recorder",
    }
    if is_p2p:
        row["p2p_seq"] = entry.get("p2p_seq_id")
    return row


def _duration_ns(duration_ms: Any) -> int | None:
    if isinstance(duration_ms, (int, float)) and math.isfinite(duration_ms) and duration_ms >= 0:
        return round(duration_ms * 1e6)
    return None


def _fr_entry_final(entry: dict[str, Any]) -> bool:
    """Gloo entries never change after creation; NCCL ones are final once completed."""
    if str(entry.get("profiling_name", "")).startswith("gloo:"):
        return True
    return bool(entry.get("retired")) or entry.get("state") == "completed"


# FR ring -> torch's JSON dump of it. NCCL's ring is a FlightRecorder<CUDAEvent> of its
# own (absent from CPU builds): the generic dump never holds NCCL entries (seen on an
# H200, torch 2.11: DDP on NCCL left collectives.jsonl empty while it read only this one).
FR_RINGS = {"nccl": "_dump_nccl_trace_json", "generic": "_dump_fr_trace_json"}
# ... and its pickle dump, without stack traces: half the JSON dump's time (2.5 against
# 7.0 ms for 384 entries, 77 against 150 ms for 2000 on the loaded 2-core VM; torch 2.13),
# the same entries. Unpickled only here, bytes this process's torch just made.
FR_RINGS_PICKLE = {"nccl": "_dump_nccl_trace", "generic": "_dump_fr_trace"}


def _ring_entries(ring: str) -> list[dict[str, Any]] | None:
    """One FR ring's entries (None: no such ring, or it could not be dumped)."""
    import torch

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, FR_RINGS_PICKLE[ring], None)
    if dump is not None:
        try:
            doc = pickle.loads(dump(True, False, False))  # noqa: S301 (made here, above)
            # as the JSON dump's, but for tuples in place of lists and None for its 0
            # "discovered" stamps: every reader here takes both (no copy: ~2 us an entry)
            return [e for e in doc.get("entries") or [] if isinstance(e, dict)]
        except (RuntimeError, TypeError, ValueError, AttributeError, pickle.UnpicklingError):
            pass
    dump = getattr(c10d, FR_RINGS[ring], None)
    if dump is None:
        return None
    try:
        return list(orjson.loads(dump(True, False)).get("entries") or [])
    except (RuntimeError, TypeError, ValueError, orjson.JSONDecodeError, AttributeError):
        return None


def dump_flight_recorder_rings() -> dict[str, list[dict[str, Any]]]:
    """Each FR ring present in this torch build, as its entries."""
    rings: dict[str, list[dict[str, Any]]] = {}
    for ring in FR_RINGS:
        entries = _ring_entries(ring)
        if entries is not None:
            rings[ring] = entries
    return rings


def dump_flight_recorder() -> list[dict[str, Any]]:
    """Every FR ring's entries ([] when FR is off or unavailable)."""
    return [e for entries in dump_flight_recorder_rings().values() for e in entries]


# --------------------------------------------------------------------------- helpers


def _first_tensor_bytes(obj: Any) -> int | None:
    if isinstance(obj, (list, tuple)):
        sizes = [_first_tensor_bytes(o) for o in obj]
        return sum(s for s in sizes if s) if sizes else None
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.numel() * obj.element_size())
    return None


def _is_cuda(obj: Any) -> bool:
    if isinstance(obj, (list, tuple)):
        return bool(obj) and _is_cuda(obj[0])
    return bool(getattr(obj, "is_cuda", False))


def _shape_of(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return [_shape_of(o) for o in obj[:8]]
    if hasattr(obj, "shape"):
        return list(obj.shape)
    return None


class _OpSignature:
    """Where an op's tensor, group and async_op arguments sit (computed once)."""

    def __init__(self, op: str, fn: Callable) -> None:
        params = list(inspect.signature(fn).parameters)
        self.names = params
        self.tensor_name = params[0] if params else None
        if op in _INPUT_SECOND:
            self.tensor_name = params[1] if len(params) > 1 else None
        if op == "barrier":
            self.tensor_name = None

    def get(self, name: str | None, args: tuple, kwargs: dict) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        try:
            index = self.names.index(name)
        except ValueError:
            return None
        return args[index] if index < len(args) else None


class _Inflight:
    """Collectives entered and not yet completed, keyed by a private token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[int, dict[str, Any]] = {}
        self._next = 0

    def enter(self, record: dict[str, Any]) -> int:
        with self._lock:
            self._next += 1
            self._items[self._next] = record
            return self._next

    def leave(self, token: int) -> dict[str, Any] | None:
        with self._lock:
            return self._items.pop(token, None)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._items.values()]


# --------------------------------------------------------------------------- recorder


def _time_row(record: dict[str, Any], end_ns: int | None, returned_ns: int) -> dict[str, Any]:
    """A collective_times row for a call the recorder watched to its end (or failure)."""
    return {
        "pg_name": record["pg_name"],
        "seq": record["seq"],
        "op": record["op"],
        "start_ns": None,
        "end_ns": end_ns,
        "returned_ns": returned_ns,
        "call_ns": record["enter_ns"],
        "source": record["source"],
        "callsite": record["callsite"],
        **(
            {"library_callsite": record["library_callsite"]}
            if record.get("library_callsite")
            else {}
        ),
    }


class CollectiveRecorder:
    """Records every collective of one rank into its run directory."""

    def __init__(self, run_dir: Path, rank: int, dump_every: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.rank_dir = rundir.rank_dir(run_dir, rank)
        self._fixed_dump_every = dump_every
        self._dump_every = dump_every or 1
        self._steps_since_dump = 0
        self._last_dump_ns = 0
        try:
            self._ring_size = int(_fr_ring_env() or FR_BUFFER_SIZE)
        except ValueError:
            self._ring_size = FR_BUFFER_SIZE
        # per FR ring: every record_id <= the watermark is written
        self._watermarks: dict[str, int] = {}
        self._written_ahead: dict[str, set[int]] = {}
        self._step_ends: list[int] = []
        self._step_ids: list[int] = []
        self._last_step: int | None = None
        self._totals: dict[tuple[str, str], dict[str, Any]] = {}
        self._lost = 0
        self._dump_ns: list[int] = []
        # the last dump's own CPU time (the training thread's): what sets the next one's
        # age (dump_age_ns); its wall time on a loaded host is mostly waiting for a core
        # (16.9 ms wall for 4.9 ms of CPU at a load average of 14 on 2 cores: a 512-entry
        # ring was dumped every 7-10 s instead of ~2 s, probe 31k D7)
        self._dump_cpu_ns: int | None = None
        self._dump_cpu_total_ns = 0
        self._times_buffer: list[dict[str, Any]] = []
        self._times_lock = threading.Lock()
        self._time_totals: dict[tuple[str, str | None], int] = {}
        self.inflight = _Inflight()
        self._ddp_models: list[Any] = []
        self._ddp_writer: rundir.JsonlWriter | None = None
        self._arrival_ns = 0
        self._arrival_count = 0
        self._coll_writer: rundir.JsonlWriter | None = None
        self._times_writer: rundir.JsonlWriter | None = None
        self._last_call: rundir.SlotWriter | None = None
        self._installed = False
        self._closed = False
        self._originals: dict[str, Callable] = {}
        self._dump_lock = threading.Lock()

    # ---------------------------------------------------------------- install

    def install(self) -> None:
        global _ACTIVE
        if self._installed:
            return
        self._installed = True
        _ACTIVE = self
        self._coll_writer = rundir.open_rank_table(self.run_dir, self.rank, rundir.COLLECTIVES)
        self._times_writer = rundir.open_rank_table(
            self.run_dir, self.rank, rundir.COLLECTIVE_TIMES
        )
        self._last_call = rundir.open_last_call(self.run_dir, self.rank)
        self.fr_enabled = self._ring_size > 0
        self._patch_dist()
        ddp.install(self)

    def _patch_dist(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in _PATCHED_OPS:
            original = getattr(c10d, name, None)
            if original is None or getattr(original, "_gpudiag_wrapped", False):
                continue
            wrapper = self._make_wrapper(name, original)
            self._originals[name] = original
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)

    def _make_wrapper(self, op: str, fn: Callable) -> Callable:
        sig = _OpSignature(op, fn)
        depth = _WRAPPER_TLS
        recorder = self

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(depth, "n", 0) or ddp.hook_is_busy():  # already recorded by the caller
                return fn(*args, **kwargs)
            try:
                group = sig.get("group", args, kwargs)
                pg = _resolve_group(group)
                if pg is not None and id(pg) not in _KEPT_GROUPS:
                    keep_process_groups(pg)
                tensor = sig.get(sig.tensor_name, args, kwargs)
                token, record = recorder._enter(op, pg, tensor, user_callsite(), "dist")
                record["library_callsite"] = library_callsite()
                recorder._note_entry(record)
            except Exception:  # recording must never fail the user's call: make it bare
                return fn(*args, **kwargs)
            depth.n = 1
            try:
                work = fn(*args, **kwargs)
            except BaseException as exc:
                _never_raises(recorder._fail, token, record, exc)
                raise
            finally:
                depth.n = 0
            _never_raises(recorder._after_call, token, record, pg, sig, args, kwargs, work)
            return work

        wrapper._gpudiag_wrapped = True  # type: ignore[attr-defined]
        return wrapper

    # ---------------------------------------------------------------- timing

    def _enter(
        self, op: str, pg: Any, tensor: Any, callsite: str | None, source: str
    ) -> tuple[int, dict[str, Any]]:
        name, seq = _pg_name_and_next_seq(pg)
        record = {
            "op": op,
            "pg_name": name,
            "seq": seq,
            "bytes": _first_tensor_bytes(tensor),
            "shape": _shape_of(tensor),
            "dtype": str(getattr(tensor, "dtype", "")).replace("torch.", "") or None,
            "callsite": callsite,
            "enter_ns": time.time_ns(),
            "source": source,
            "thread": threading.current_thread().name,
            # NCCL work completes on the GPU after the call/future returns: no end time
            "cuda": _is_cuda(tensor),
        }
        return self.inflight.enter(record), record

    def _note_entry(self, record: dict[str, Any]) -> None:
        """The call this rank is in, on disk before it starts: a rank that gloo aborts in
        C++ (a size mismatch) flushes nothing else, and its size names the culprit."""
        if self._last_call is not None:
            keys = ("op", "pg_name", "seq", "bytes", "shape", "dtype", "callsite", "enter_ns")
            self._last_call.write({k: record[k] for k in keys})

    def _after_call(
        self,
        token: int,
        record: dict[str, Any],
        pg: Any,
        sig: _OpSignature,
        args: tuple,
        kwargs: dict,
        work: Any,
    ) -> None:
        self._issued(record, pg)
        if sig.get("async_op", args, kwargs) and work is not None:
            self._complete_on_future(token, record, work)
        else:
            self._complete(token, record)

    @staticmethod
    def _issued(record: dict[str, Any], pg: Any) -> None:
        """After the call returned the op is issued: read its real sequence number."""
        seq = _pg_seq(pg)
        if seq is not None and seq != record["seq"]:
            record["seq_predicted"] = record["seq"]
            record["seq"] = seq

    def _complete_on_future(self, token: int, record: dict[str, Any], work: Any) -> None:
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):
            fut = None
        if fut is None:  # no future to watch (p2p on gloo): FR alone records it
            self.inflight.leave(token)
            return
        fut.add_done_callback(lambda _f: self._complete(token, record))

    def _complete(self, token: int, record: dict[str, Any]) -> None:
        end = time.time_ns()
        self.inflight.leave(token)
        self._add_time_row(_time_row(record, None if record["cuda"] else end, end))

    def _fail(self, token: int, record: dict[str, Any], exc: BaseException) -> None:
        self.inflight.leave(token)
        row = _time_row(record, None, time.time_ns())
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        row["bytes"] = record["bytes"]
        row["shape"] = record["shape"]
        self._add_time_row(row)
        self._flush_times()

    def _add_time_row(self, row: dict[str, Any]) -> None:
        """Buffered; out at the step end, or when 256 rows or 1 s old (so the hang
        watchdog sees progress in loops without optimizer steps)."""
        with self._times_lock:
            self._times_buffer.append(row)
            if row.get("end_ns") and row.get("call_ns"):
                key = (row["op"], row["pg_name"])
                self._time_totals[key] = self._time_totals.get(key, 0) + (
                    row["end_ns"] - row["call_ns"]
                )
            full = len(self._times_buffer) >= _TIMES_FLUSH_ROWS or (
                row["returned_ns"] - self._times_buffer[0]["returned_ns"] > _TIMES_FLUSH_NS
            )
        if full:
            self._flush_times()

    def flush_stale_times(self) -> None:
        """Flush buffered stamps older than the flush age (called from a background
        thread; the main thread flushes at step ends and when the buffer fills)."""
        with self._times_lock:
            stale = bool(self._times_buffer) and (
                time.time_ns() - self._times_buffer[0]["returned_ns"] > _TIMES_FLUSH_NS
            )
        if stale:
            self._flush_times()

    def _flush_times(self) -> None:
        with self._times_lock:
            rows, self._times_buffer = self._times_buffer, []
        if rows and self._times_writer is not None:
            _write_rows(self._times_writer, rows)

    # ---------------------------------------------------------------- steps

    def on_step_end(self, step: int, t_ns: int) -> None:
        """Step boundary (hot path): buffered stamps out, FR dumped every K steps."""
        if not self._installed or self._closed:
            return
        self._step_ends.append(t_ns)
        self._step_ids.append(step)
        self._last_step = step
        keep_process_groups()
        self._flush_times()
        ddp.record_step(self, step, t_ns)
        self._steps_since_dump += 1
        if self.fr_enabled and (
            self._steps_since_dump >= self._dump_every
            or t_ns - self._last_dump_ns > dump_age_ns(self._dump_cpu_ns)
        ):
            self._last_dump_ns = t_ns
            steps_since, self._steps_since_dump = self._steps_since_dump, 0
            new = self.dump()
            if self._fixed_dump_every is None:
                self._adapt_dump_every(new, steps_since)

    def _adapt_dump_every(self, new_entries: int, steps: int | None = None) -> None:
        per_step = max(new_entries / max(steps or self._dump_every, 1), 1e-9)
        budget = self._ring_size * _DUMP_FILL
        self._dump_every = int(max(1, min(_MAX_DUMP_EVERY, budget // per_step)))

    def _step_of(self, t_ns: int | None) -> int | None:
        """The step an entry created at ``t_ns`` belongs to (first step ending after it)."""
        if t_ns is None:
            return None
        i = bisect.bisect_left(self._step_ends, t_ns)
        if i < len(self._step_ids):
            return self._step_ids[i]
        return None if self._last_step is None else self._last_step + 1

    # ---------------------------------------------------------------- FR dump

    def dump(self) -> int:
        """Append FR entries not yet written; returns how many records were new (lost
        ones included, so the dump interval adapts down after a loss)."""
        with self._dump_lock:
            t0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
            rows = [
                row
                for ring, entries in dump_flight_recorder_rings().items()
                for row in self._new_rows(entries, ring)
            ]
            if rows and self._coll_writer is not None:
                _write_rows(self._coll_writer, rows)
            self._dump_ns.append(time.perf_counter_ns() - t0)
            self._dump_cpu_ns = time.thread_time_ns() - cpu0
            self._dump_cpu_total_ns += self._dump_cpu_ns
            return sum(r.get("lost_records", 1) for r in rows)

    def watermark(self, ring: str) -> int:
        """Every record_id of the FR ring up to this one is written (-1: none)."""
        return self._watermarks.get(ring, -1)

    def _new_rows(self, entries: list[dict[str, Any]], ring: str) -> list[dict[str, Any]]:
        pg_info = _pg_info()
        rows: list[dict[str, Any]] = []
        entries = sorted(entries, key=lambda e: e.get("record_id", -1))
        mark, ahead = self.watermark(ring), self._written_ahead.setdefault(ring, set())
        blocked = False
        for entry in entries:
            rid = entry.get("record_id")
            if not isinstance(rid, int) or rid <= mark or rid in ahead:
                continue
            if not blocked and rid > mark + 1:
                rows.append(self._lost_row(mark + 1, rid - 1))
                mark = rid - 1
            if not _fr_entry_final(entry) and not self._closed:
                blocked = True
                continue
            row = fr_entry_to_row(entry, pg_info)
            row["step"] = self._step_of(row["enqueue_ns"])
            self._note_arrival(row)
            rows.append(row)
            self._count(row)
            if blocked:
                ahead.add(rid)
            else:
                mark = rid
        while mark + 1 in ahead:
            mark += 1
            ahead.discard(mark)
        self._watermarks[ring] = mark
        self._trim_steps()
        return rows

    def _lost_row(self, first: int, last: int) -> dict[str, Any]:
        count = last - first + 1
        self._lost += count
        return {
            "op": "lost",
            "record_id": first,
            "lost_records": count,
            "step": self._last_step,
            "source": "flight_recorder_gap",
        }

    def _note_arrival(self, row: dict[str, Any]) -> None:
        """How far into its step each collective was issued: in synchronous training the
        steps of all ranks end together, so a rank that issues its collectives later
        than the others (summary: arrival_ms_mean) is the one they wait for. Needs no
        completion times, so it works on gloo without the timing hook."""
        step, enqueue = row.get("step"), row.get("enqueue_ns")
        if not step or enqueue is None:  # step 0 has no previous boundary
            return
        i = bisect.bisect_left(self._step_ids, step - 1)
        if i < len(self._step_ids) and self._step_ids[i] == step - 1:
            self._arrival_ns += max(0, enqueue - self._step_ends[i])
            self._arrival_count += 1

    def _trim_steps(self) -> None:
        keep = 4 * _MAX_DUMP_EVERY  # more than the steps between two dumps
        if len(self._step_ends) > 2 * keep:
            del self._step_ends[:-keep]
            del self._step_ids[:-keep]

    def _count(self, row: dict[str, Any]) -> None:
        key = (row["op"], row["pg_name"])
        total = self._totals.setdefault(key, {"count": 0, "bytes": 0, "known_time_ns": 0})
        total["count"] += 1
        total["bytes"] += row["in_bytes"] or 0

    # ---------------------------------------------------------------- end

    def summary(self) -> dict[str, Any]:
        """Collective totals per (op, pg) plus recorder health."""
        with self._times_lock:
            times = dict(self._time_totals)
        per = []
        for (op, pg), total in sorted(self._totals.items()):
            per.append({"op": op, "pg_name": pg, **total, "known_time_ns": times.get((op, pg), 0)})
        dumps = sorted(self._dump_ns)
        return {
            "collectives": per,
            "fr_lost_records": self._lost,
            "fr_dumps": len(dumps),
            "fr_dump_median_ns": dumps[len(dumps) // 2] if dumps else None,
            "fr_dump_max_ns": dumps[-1] if dumps else None,
            # what the dumps cost the training thread in all: wall and its own CPU time
            "fr_dump_total_ns": sum(dumps),
            "fr_dump_cpu_total_ns": self._dump_cpu_total_ns,
            "fr_dump_every_steps": self._dump_every,
            "arrival_ms_mean": (
                self._arrival_ns / self._arrival_count / 1e6 if self._arrival_count else None
            ),
            "arrival_count": self._arrival_count,
        }

    def close(self) -> None:
        """Final dump; call before the process group is destroyed."""
        if not self._installed or self._closed:
            return
        self._flush_times()
        self._closed = True
        if self.fr_enabled:
            self.dump()
        self._flush_times()
        # DDP's logging data takes its reducer's lock, which a main thread stuck in
        # backward holds (a frozen peer: the hang watchdog's finish, from the poller
        # thread, waited on it until killed, and the rank lost its status.json): the last
        # row only from the main thread, which holds nothing then.
        in_main = threading.current_thread() is threading.main_thread()
        if self._last_step is not None and not ddp.stats_due(self._last_step) and in_main:
            ddp.record_step(self, self._last_step, time.time_ns(), force=True)
        ddp.close(self)
        for writer in (self._coll_writer, self._times_writer):
            if writer is not None:
                writer.close()
        if self._last_call is not None:
            self._last_call.close()


# Every process group the script made, held until the process ends with os._exit.
_KEPT_GROUPS: dict[int, Any] = {}


def keep_process_groups(pg: Any = None) -> None:
    """Hold a reference to ``pg`` and to every registered process group, so that none is
    destroyed while the process runs. ProcessGroupGloo's destructor joins its worker
    threads with the GIL held, and a worker that then drops the last reference to a work
    item made during backward needs the GIL to free the Python context autograd stashed
    in its thread-local state (torch 2.13): a deadlock. It struck when a script's
    function returned and its DDP model's Reducer held the last reference to a group the
    script had destroyed (`accelerator.end_training()`): the rank hung in that return,
    its peers long gone (1 in 9 runs of an accelerate loop under gpudiag; torch#56297's
    class). A group kept here is deregistered by destroy_process_group as usual; its
    object lives until os._exit, which runs no destructor."""
    try:
        if pg is not None:
            _KEPT_GROUPS.setdefault(id(pg), pg)
        from torch.distributed import distributed_c10d as c10d

        groups = c10d._world.pg_map
        if len(groups) > len(_KEPT_GROUPS) or pg is None:
            for group in list(groups):
                _KEPT_GROUPS.setdefault(id(group), group)
    except Exception:  # noqa: BLE001 - an older or newer torch: keep nothing
        pass


def _never_raises(record: Callable[..., None], *args: Any) -> None:
    """A recording step after the user's call: its failure is gpudiag's, never the call's."""
    try:
        record(*args)
    except Exception:
        pass


def _write_rows(writer: rundir.JsonlWriter, rows: list[dict[str, Any]]) -> None:
    """Rows out with orjson (several times faster than json on this path): the rows are
    plain ints, strings, lists and None."""
    if not hasattr(writer, "write_text"):
        writer.write_many(rows)
        return
    writer.write_text(b"".join(orjson.dumps(r) + b"\n" for r in rows).decode())


# --------------------------------------------------------------------------- groups


def _resolve_group(group: Any) -> Any:
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return dist.GroupMember.WORLD
    return group


def _pg_seq(pg: Any) -> int | None:
    try:
        return int(pg._get_sequence_number_for_group())
    except (AttributeError, RuntimeError, TypeError):
        return None


def _pg_name_and_next_seq(pg: Any) -> tuple[str | None, int | None]:
    """The group's name (as FR spells it) and the seq its next collective will get."""
    import torch.distributed.distributed_c10d as c10d

    try:
        name = c10d._world.pg_names.get(pg)
    except (AttributeError, TypeError):
        name = None
    seq = _pg_seq(pg)
    return name, None if seq is None else seq + 1


def _pg_info() -> dict[str, tuple[int, list[int]]]:
    """pg name -> (size, global ranks) for every group this process knows."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    info: dict[str, tuple[int, list[int]]] = {}
    try:
        names = dict(c10d._world.pg_names)
    except AttributeError:
        return info
    for pg, name in names.items():
        try:
            ranks = dist.get_process_group_ranks(pg)
        except (RuntimeError, ValueError, KeyError):
            continue
        info[name] = (len(ranks), ranks)
    return info
