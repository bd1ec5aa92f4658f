"""What shows that a run's all-reduces are DDP's gradient buckets (issue 31, D).

The all-reduces of a step are called DDP gradient buckets, and get DDP's advice
(``bucket_cap_mb``, ``no_sync()``, its comm hooks; the ``bucket_size`` finding and the
``comm_bucketed`` what-if), only where the run shows DDP: DDP's own logging data, recorded
by ``gpudiag trace`` (its bucket sizes among them), or DDP's record_function names in a
trace (``DistributedDataParallel.forward``, the Reducer's ``reducer::`` ops). A Megatron or
vLLM tensor-parallel run has neither: its all-reduces are the layers', not buckets
(RunInfo.ddp_evidence is then None, RunInfo.allreduce_label "all-reduce calls").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from gpudiag.analysis import classify as cls

# DDP's record_function names and how they are said: its forward, and its Reducer's ops
# (copy_bucket_to_grad, mul_out, ...: torch/csrc/distributed/c10d/reducer.cpp).
DDP_NAMES = (
    ("DistributedDataParallel.forward", "DistributedDataParallel.forward"),
    ("reducer::", "DDP's Reducer (reducer::...)"),
)
LOGGED = "DDP's logging data (bucket sizes) recorded by gpudiag trace"


def ddp_evidence(traces: list[Any], run: Any) -> str | None:
    """What says the run's all-reduces are DDP's gradient buckets, in words
    (RunInfo.ddp_evidence): the run's DDP logging data, else the first DDP name found
    in a trace (:data:`DDP_NAMES`); None when nothing does."""
    if run is not None and len(getattr(run, "ddp_stats", [])):
        return LOGGED
    for trace in traces:
        found = trace_ddp_names(trace)
        if found:
            return f"{found} in the traces"
    return None


def _contains(needle: str) -> Callable[[pd.Series], pd.Series]:
    return lambda names: names.str.contains(needle, regex=False)


def trace_ddp_names(trace: Any) -> str:
    """The first of DDP's names (:data:`DDP_NAMES`) the trace has, in words; "" for
    none. A per-rank analysis: cached on the trace where it was loaded."""

    def compute() -> str:
        names = trace.events["name"]
        for needle, words in DDP_NAMES:
            if cls.name_mask(names, _contains(needle)).any():
                return words
        return ""

    return str(trace.cached("uses_ddp", compute))
