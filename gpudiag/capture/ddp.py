"""DDP instrumentation without user code change (runs inside the training process).

At each DistributedDataParallel's first forward, only with ``gpudiag trace
--time-buckets`` (GPUDIAG_DDP_HOOK=1), on gloo, when the user registered no comm hook:
gpudiag's copy of ``default_hooks.allreduce_hook`` that stamps each bucket all-reduce's
completion (gloo FR has no completion times). It is opt-in because any Python comm hook
on gloo costs ~0.4-0.7 ms per step on these 2-core machines (measured: +11 % for torch's
own Python allreduce_hook, +18 % for the timed one, on a 4 ms step), while outside the
profiler window capture must be nearly free; inside the window the trace has every
bucket's transfer anyway (``gloo:all_reduce``). A user's own hook is wrapped at
registration to be timed the same way. Every ``GPUDIAG_DDP_STATS_EVERY`` steps (default
10; past step 100 every 100th, when DDP refreshes them), and at the end while the model
lives, the numeric fields of
``_get_ddp_logging_data()`` go to ``ddp_stats.jsonl``: fetching them costs ~0.1-0.3 ms (a
dict of ~40 fields built in C++), too much for every step. DDP's runtime logging keeps
torch's own sampling (iterations 1-10, then every 100th), so the ``avg_*`` fields average
the sampled iterations.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from gpudiag import rundir
from gpudiag.capture.callsite import user_callsite


class CollectiveRecorder(Protocol):
    """What this module uses of collectives.CollectiveRecorder (which imports this
    module: naming the class here would close an import circle)."""

    run_dir: Any
    rank: int
    _originals: dict[str, Callable[..., Any]]
    _ddp_models: list[weakref.ref[Any]]
    _ddp_writer: Any

    def _enter(
        self, op: str, pg: Any, tensor: Any, callsite: str | None, source: str
    ) -> tuple[int, dict[str, Any]]: ...

    def _issued(self, record: dict[str, Any], pg: Any) -> None: ...

    def _complete(self, token: int, record: dict[str, Any]) -> None: ...

    def _fail(self, token: int, record: dict[str, Any], exc: BaseException) -> None: ...


ENV_STATS_EVERY = "GPUDIAG_DDP_STATS_EVERY"
STATS_EVERY = max(1, int(os.environ.get(ENV_STATS_EVERY, "10") or 10))
# DDP refreshes its runtime stats at iterations 1-10 and then every 100th (torch's own
# sampling, kept): past step 100 a row every STATS_EVERY steps would repeat the last one.
TORCH_SAMPLE_EVERY = 100


def stats_due(step: int) -> bool:
    """A ddp_stats row at this step: every STATS_EVERY steps up to step 100, then every
    100th (unless GPUDIAG_DDP_STATS_EVERY asks for a coarser interval)."""
    if step % STATS_EVERY:
        return False
    return step < TORCH_SAMPLE_EVERY or step % max(STATS_EVERY, TORCH_SAMPLE_EVERY) == 0


# Fields of _get_ddp_logging_data() worth a row each step (others are constant strings).
DDP_STAT_FIELDS = (
    "avg_forward_compute_time",
    "avg_backward_compute_time",
    "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time",
    "forward_compute_time",
    "backward_compute_time",
    "backward_comm_time",
    "backward_compute_comm_overlap_time",
    "bucket_cap_bytes",
    "rebuilt_bucket_sizes",
    "rebuilt_per_bucket_param_indices",
    "num_parameter_tensors",
    "total_parameter_size_bytes",
    "world_size",
    "has_rebuilt_buckets",
    "unused_parameter_size",
    "comm_hook",
    "find_unused_parameters",
    "gradient_as_bucket_view",
    "static_graph",
    "iteration",
)
_LIST_FIELDS = ("rebuilt_bucket_sizes",)

ENV_DDP_HOOK = "GPUDIAG_DDP_HOOK"  # "1": timing hook on gloo (bucket end times); default off

_PATCHED = False
_RECORDER: CollectiveRecorder | None = None
_SEEN: weakref.WeakSet = weakref.WeakSet()
_USER_HOOKED: weakref.WeakSet = weakref.WeakSet()
_HOOK_TLS = threading.local()


def install(recorder: CollectiveRecorder) -> None:
    """Patch DistributedDataParallel once per process."""
    global _PATCHED, _RECORDER
    _RECORDER = recorder
    if _PATCHED:
        return
    _PATCHED = True
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_forward = DDP.forward
    original_register = DDP.register_comm_hook
    original_builtin = DDP._register_builtin_comm_hook

    @functools.wraps(original_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self not in _SEEN:
            _SEEN.add(self)
            _on_first_forward(self)
        return original_forward(self, *args, **kwargs)

    @functools.wraps(original_register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        _USER_HOOKED.add(self)
        return original_register(self, state, timed_hook(hook, source="user_comm_hook"))

    @functools.wraps(original_builtin)
    def register_builtin(self: Any, comm_hook_type: Any) -> None:
        _USER_HOOKED.add(self)  # C++ hooks cannot be timed; FR still lists their work
        return original_builtin(self, comm_hook_type)

    # patching the class is the point: every DDP model of the script goes through here
    DDP.forward = forward  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DDP._register_builtin_comm_hook = register_builtin  # type: ignore[method-assign]


def leave_untouched(model: Any) -> None:
    """Keep gpudiag's comm hook off this DDP model (DDP's C++ default all-reduce runs)."""
    _USER_HOOKED.add(model)


def _on_first_forward(model: Any) -> None:
    # DDP's runtime logging keeps torch's own sampling (the first 10 iterations, then
    # every 100th): sampling every iteration cost ~0.7 ms per step on gloo here (3.5 % of
    # a 20 ms step, bench/overhead_parts.py), and on CUDA each sampled iteration
    # synchronises five CUDA events at the next forward (reducer's Logger).
    if _RECORDER is not None:
        _RECORDER._ddp_models.append(weakref.ref(model))
    if model in _USER_HOOKED or getattr(model, "_comm_hooks", None) or not _wants_hook(model):
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The unpatched method: this is gpudiag's hook, not the user's.
    unpatched: Callable[..., None] = getattr(DDP.register_comm_hook, "__wrapped__")  # noqa: B009
    unpatched(model, model.process_group, timed_allreduce_hook)


def _wants_hook(model: Any) -> bool:
    """Only where it gives completion times: gloo. On NCCL the hook's future completes
    at enqueue, and the Flight Recorder (with TORCH_NCCL_ENABLE_TIMING) has the times."""
    if os.environ.get(ENV_DDP_HOOK, "0") != "1":
        return False
    import torch.distributed as dist

    try:
        return dist.get_backend(model.process_group) == "gloo"
    except (RuntimeError, ValueError, AttributeError):
        return False


def timed_allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """``default_hooks.allreduce_hook`` with the completion stamped in its own ``then``
    callback (one Python callback per bucket, as in the original; not two)."""
    import torch.distributed as dist

    recorder = _RECORDER
    group: Any = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    if recorder is None:
        return (
            _raw_all_reduce()(tensor, group=group, async_op=True)
            .get_future()
            .then(lambda fut: fut.value()[0])
        )
    # On CPU backward runs in the caller's thread: the user's frame is its backward() line.
    token, record = recorder._enter("all_reduce", group, tensor, user_callsite(), "ddp_hook")
    record["bucket"] = bucket.index()
    try:
        work = _raw_all_reduce()(tensor, group=group, async_op=True)
    except BaseException as exc:
        recorder._fail(token, record, exc)
        raise
    recorder._issued(record, group)

    def done(fut: Any) -> Any:
        recorder._complete(token, record)
        return fut.value()[0]

    return work.get_future().then(done)


# DDP checks a hook's annotations against dist.GradBucket / Future[Tensor]; under
# `from __future__ import annotations` they are strings and fail that check.
timed_allreduce_hook.__annotations__ = {}


def _raw_all_reduce() -> Any:
    """torch.distributed.all_reduce without gpudiag's wrapper (the hook records itself)."""
    import torch.distributed.distributed_c10d as c10d

    recorder = _RECORDER
    if recorder is not None and "all_reduce" in recorder._originals:
        return recorder._originals["all_reduce"]
    return c10d.all_reduce


def timed_hook(hook: Any, source: str) -> Any:
    """Wrap a DDP comm hook so that its collective is tracked and its completion stamped."""

    @functools.wraps(hook)
    def wrapper(state: object, bucket: Any) -> Any:
        recorder = _RECORDER
        if recorder is None or getattr(_HOOK_TLS, "busy", False):
            return hook(state, bucket)
        import torch.distributed as dist

        pg = (
            state if isinstance(state, dist.ProcessGroup) else getattr(state, "process_group", None)
        )
        pg = pg if isinstance(pg, dist.ProcessGroup) else dist.GroupMember.WORLD
        token, record = recorder._enter("all_reduce", pg, bucket.buffer(), None, source)
        record["bucket"] = bucket.index()
        _HOOK_TLS.busy = True  # the user's hook may call the patched dist.* functions
        try:
            fut = hook(state, bucket)
        except BaseException as exc:
            recorder._fail(token, record, exc)
            raise
        finally:
            _HOOK_TLS.busy = False
        recorder._issued(record, pg)
        fut.add_done_callback(lambda _f: recorder._complete(token, record))
        return fut

    return wrapper


def hook_is_busy() -> bool:
    return bool(getattr(_HOOK_TLS, "busy", False))


def _stats_row(data: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key in DDP_STAT_FIELDS:
        if key not in data:
            continue
        value = data[key]
        if key in _LIST_FIELDS and isinstance(value, str):
            value = [int(v) for v in value.split(",") if v.strip().lstrip("-").isdigit()]
        elif isinstance(value, bool):
            value = int(value)
        elif not isinstance(value, (int, float, list)):
            if key == "comm_hook":
                value = str(value)
            else:
                continue
        row[key] = value
    return row


def record_step(recorder: CollectiveRecorder, step: int, t_ns: int, force: bool = False) -> None:
    """One ddp_stats row per live DDP model at the steps :func:`stats_due` names (and
    when forced, at the end of the run)."""
    if not recorder._ddp_models or (not force and not stats_due(step)):
        return
    if recorder._ddp_writer is None:
        recorder._ddp_writer = rundir.open_rank_table(
            recorder.run_dir, recorder.rank, rundir.DDP_STATS
        )
    rows = []
    for index, ref in enumerate(recorder._ddp_models):
        model = ref()
        if model is None:
            continue
        try:
            data = model._get_ddp_logging_data()
        except (AttributeError, RuntimeError):
            continue
        rows.append({"step": step, "t_ns": t_ns, "model": index, **_stats_row(data)})
    recorder._ddp_writer.write_many(rows)


def close(recorder: CollectiveRecorder) -> None:
    if recorder._ddp_writer is not None:
        recorder._ddp_writer.close()
        recorder._ddp_writer = None
