"""The one place that decides what a trace event is.

Every other module asks for ``kind`` / ``comm_op`` and never matches event names itself,
so a renamed kernel (NCCL's ``ncclKernel_*`` -> ``ncclDevKernel_*``, RCCL's
``ncclDevKernel_Generic``, PyTorch's symmetric-memory ``multimem_all_reduce_kernel``) is
fixed here once.

Classification runs once per distinct (name, cat) pair, not once per event.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import pandas as pd

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})

# Every category spelling Kineto has written (lower-cased) -> the current name. libkineto's
# output_json.cpp wrote "Operator", "User", "Runtime", "Kernel", "Memcpy", "Memset" until
# 2021/22 (PyTorch <= 1.10); ActivityType.h names the rest (xpu/mtia/privateuse1 runtimes
# for other devices, "gpu_user_Annotation" with a capital A). Names not listed pass through.
CATEGORY_ALIASES = {
    "operator": "cpu_op",
    "cpu_op": "cpu_op",
    "user": "user_annotation",
    "user_annotation": "user_annotation",
    "kernel": "kernel",
    "concurrent_kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "gpu_memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "gpu_memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation",
    "runtime": "cuda_runtime",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "hip_runtime": "cuda_runtime",
    "hip_driver": "cuda_driver",
    "xpu_runtime": "cuda_runtime",
    "xpu_driver": "cuda_driver",
    "mtia_runtime": "cuda_runtime",
    # MTIA's device events (HTA's kernel categories: kernel, gpu_mem*, mtia_ccp_events);
    # those named dma* are its copies (HTA's MTIAMemoryKernelGroupingPattern)
    "mtia_ccp_events": "kernel",
    "privateuse1_runtime": "cuda_runtime",
    "privateuse1_driver": "cuda_driver",
}


def canonical_category(cat: object) -> str:
    """The current Kineto name of a trace event's ``cat`` (any spelling, any case)."""
    if type(cat) is not str:
        return ""
    low = cat.lower()
    return CATEGORY_ALIASES.get(low, low)


KINDS = (
    "compute",
    "comm",
    "memcpy",
    "memset",
    "cpu_op",
    "comm_cpu",
    "annotation",
    "step",
    "runtime",
    "sync",
    "dataloader",
    "optimizer",
    "other",
)

COMM_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "send_recv",
    "reduce",
    "gather",
    "scatter",
    "barrier",
)

_NCCL_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)\w*?(?:Kernel|DevKernel)_", re.IGNORECASE)
_NON_NCCL_COMM_KERNEL = re.compile(
    r"(multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce|multimem_all_gather|"
    r"cross_device_reduce|all_reduce_kernel|allreduce_kernel|all_gather_kernel|"
    r"reduce_scatter_kernel|msccl|symmetric_memory)",
    re.IGNORECASE,
)
# Communication libraries that launch their own kernels (their own name, at the start):
# DeepEP's MoE all-to-all (``deep_ep::intranode::dispatch``, DeepSeek's build
# ``dpsk::ep::internode::combine_ll``; not ``dpsk::ep::cuda::get_dispatch_layout``, a
# layout computation, nor ``cdpsk::ep::CUB_...`` scans) and NVSHMEM's device kernels.
# MSCCL / MSCCL++ (``mscclpp::...``) match ``msccl`` above.
_LIBRARY_COMM_KERNEL = re.compile(
    r"^(?:void\s+)?(?:(?:dpsk::ep|deep_ep)::(?:intranode|internode|internode_ll)::|"
    r"(?:\w+::)*nvshmemi?_)",
    re.IGNORECASE,
)
_EP_KERNEL = re.compile(r"^(?:void\s+)?(?:dpsk::ep|deep_ep)::", re.IGNORECASE)
_CPU_COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "mpi:", "ucc:", "xccl:")
_SYNC_NAMES = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "aten::item",
        "aten::_local_scalar_dense",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)

# keys after lower-casing, stripping namespaces/underscores and variant suffixes
_OP_KEYS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send_recv",
    "recv": "send_recv",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
_OP_SUFFIXES = ("coalesced", "intotensor", "tensor", "base", "single", "multigpu")

DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "fp32": 4,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "double": 8,
    "float64": 8,
    "f64": 8,
    "int8": 1,
    "int8_t": 1,
    "char": 1,
    "i8": 1,
    "uint8": 1,
    "uint8_t": 1,
    "byte": 1,
    "u8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "f8": 1,
    "fp8": 1,
    "int": 4,
    "int32": 4,
    "int32_t": 4,
    "i32": 4,
    "uint32": 4,
    "uint32_t": 4,
    "u32": 4,
    "long": 8,
    "int64": 8,
    "int64_t": 8,
    "i64": 8,
    "uint64": 8,
    "uint64_t": 8,
    "u64": 8,
    "short": 2,
    "int16": 2,
    # C++ spellings in the profiler's "Input type" (c10 scalar type names)
    "long int": 8,
    "long long": 8,
    "long long int": 8,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "unsigned int": 4,
    "unsigned long": 8,
}


def normalise_op(raw: str | None) -> str | None:
    """``c10d::_allgather_base_``, ``nccl:all_reduce``, ``Collective name`` = ``allreduce``,
    ``AllReduce`` ... -> one of :data:`COMM_OPS`, or None (``wait``, ``Generic``, unknown)."""
    if not raw:
        return None
    return _normalise_op(str(raw))


@lru_cache(maxsize=4096)
def _normalise_op(raw: str) -> str | None:
    key = raw.lower()
    for prefix in _CPU_COMM_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
    key = key.replace("_", "")
    changed = True
    while changed:
        changed = False
        for suffix in _OP_SUFFIXES:
            if key.endswith(suffix) and key != suffix:
                key = key[: -len(suffix)]
                changed = True
    return _OP_KEYS.get(key)


@lru_cache(maxsize=4096)  # per distinct kernel name, asked again by every rank's parse
def is_comm_kernel(name: str) -> bool:
    return bool(
        _NCCL_KERNEL.match(name)
        or _NON_NCCL_COMM_KERNEL.search(name)
        or _LIBRARY_COMM_KERNEL.match(name)
    )


@lru_cache(maxsize=4096)
def kernel_comm_op(name: str) -> str | None:
    """Collective type from a comm kernel's name; None for RCCL's ``Generic`` (resolved
    later from the CPU-side op)."""
    m = re.search(r"(?:Kernel|DevKernel)_([A-Za-z]+)", name)
    if m:
        return normalise_op(m.group(1))
    if _EP_KERNEL.match(name):  # DeepEP: dispatch / combine (and their notify) are all-to-all
        return "all_to_all"
    low = name.lower()
    for token in ("all_reduce", "all_gather", "reduce_scatter", "allreduce", "allgather"):
        if token in low:
            return normalise_op(token)
    if "cross_device_reduce" in low:
        return "all_reduce"
    return None


@lru_cache(maxsize=4096)
def kernel_dtype(name: str) -> str | None:
    """Element type encoded in NCCL kernel names (``_Sum_f16_``, ``_Sum_float``)."""
    m = re.search(
        r"_(?:Sum|Prod|Max|Min|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+?)(?:_|\(|$)", name
    )
    if m and m.group(1).lower() in DTYPE_BYTES:
        return m.group(1).lower()
    return None


def dtype_size(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return DTYPE_BYTES.get(str(dtype).lower().replace("c10::", "").replace("torch.", ""))


def is_cpu_comm_name(name: str) -> bool:
    return name == "record_param_comms" or name.startswith(_CPU_COMM_PREFIXES)


@lru_cache(maxsize=65536)
def classify_one(name: str, cat: str) -> str:
    if cat == "kernel":
        if name.startswith("dma"):  # MTIA's copies (mtia_ccp_events named dma*)
            return "memcpy"
        return "comm" if is_comm_kernel(name) else "compute"
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if cat == "gpu_user_annotation":
        return "annotation"
    if name.startswith("ProfilerStep#"):
        return "step"
    if name.startswith("gloo:"):
        return "comm"  # gloo's transfer, on its pt_gloo_runloop threads
    if is_cpu_comm_name(name):
        return "comm_cpu"
    if name in _SYNC_NAMES:
        return "sync"
    if cat in ("cuda_runtime", "cuda_driver"):
        return "runtime"
    if "DataLoader" in name and ("__next__" in name or name.startswith("enumerate(")):
        return "dataloader"
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    if cat == "user_annotation":
        return "annotation"
    if cat == "cpu_op":
        return "cpu_op"
    return "other"


def classify(names: pd.Series, cats: pd.Series) -> pd.Categorical:
    """``kind`` for every event; one Python call per distinct (name, cat) pair."""
    if len(names) == 0:
        return pd.Categorical([], categories=KINDS)
    names = names.astype("category")
    cats = cats.astype("category")
    name_cats = names.cat.categories
    cat_cats = cats.cat.categories
    width = len(cat_cats) + 1
    pair = names.cat.codes.to_numpy().astype(np.int64)  # in place: no more full-length
    pair *= width  # temporaries than needed (10M events: 80 MB each)
    pair += cats.cat.codes.to_numpy()
    size = len(name_cats) * width
    table = pair.min() >= 0 and size <= 1 << 22  # the few possible pairs, no sort
    if table:
        present = np.zeros(size, dtype=bool)
        present[pair] = True
        uniq = np.flatnonzero(present)
    else:  # a missing name or category, or too many pairs
        uniq, inverse = np.unique(pair, return_inverse=True)
    kind_codes = np.array(
        [
            KINDS.index(classify_one(str(name_cats[p // width]), str(cat_cats[p % width])))
            for p in uniq
        ],
        dtype=np.int8,
    )
    if table:
        by_pair = np.zeros(size, dtype=np.int8)
        by_pair[uniq] = kind_codes
        codes = by_pair[pair]
    else:
        codes = kind_codes[inverse.ravel()]
    categories = pd.Index(KINDS, dtype=object)
    return pd.Categorical.from_codes(codes, categories=categories)


def kinds(events: pd.DataFrame) -> pd.Categorical | np.ndarray:
    """The ``kind`` column for ``==`` / :func:`kind_in` masks: the event table's
    categorical itself (a 10M-event table's kinds as objects would cost 80 MB a copy)."""
    kind = events["kind"]
    return kind.array if isinstance(kind.dtype, pd.CategoricalDtype) else kind.to_numpy()


def kind_in(kind: pd.Categorical | np.ndarray, values: Sequence[str]) -> np.ndarray:
    """``np.isin(kind, values)``, on the codes for a categorical."""
    if isinstance(kind, pd.Categorical):
        return kind.isin(list(values))
    return np.isin(kind, values)


def name_mask(names: pd.Series, test: Callable[[pd.Series], pd.Series]) -> np.ndarray:
    """``test(names.astype(str))`` as a bool array, e.g. ``lambda s: s.str.contains(p)``;
    on a categorical column (the event table's) it runs once per distinct name, and no
    string column of the table's length is ever built."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return test(names.astype(str)).to_numpy(dtype=bool)
    categorical = names.array
    labels = pd.Series(pd.Categorical(categorical.categories)).astype(str)
    hits = np.append(test(labels).to_numpy(dtype=bool), False)  # last: no name (code -1)
    return hits[categorical.codes]
