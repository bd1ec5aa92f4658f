"""Ingestion of the real GPU traces in ../shared/traces and of foreign file layouts."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson
import pandas as pd
import pytest

from gpudiag.analysis import classify as cls
from gpudiag.analysis.ingest import (
    COMM_COLUMNS,
    EVENT_COLUMNS,
    RankTrace,
    find_traces,
    load_trace,
    load_traces,
    rank_from_name,
    with_comm,
)

SETS = {
    "astrasim_megatron_tp8": 8,
    "param_dlrm_ddp8": 8,
    "tracelens_mi300_ddp": 1,
    "tracelens_b200_vllm": 1,
    "hta_nccl_a100": 1,
    "hta_sampled_2of128": 2,
}


@pytest.fixture(scope="module")
def loaded(shared_traces: Path) -> dict[str, tuple[list[RankTrace], list[str]]]:
    out = {}
    for name in SETS:
        warnings: list[str] = []
        out[name] = (load_traces(find_traces(shared_traces / name), warnings=warnings), warnings)
    return out


def _comm_kernels(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    return with_comm(ev[ev["is_gpu"] & (ev["kind"] == "comm")], trace.comm)


def test_every_set_loads_with_schema(loaded) -> None:
    for name, count in SETS.items():
        traces, _ = loaded[name]
        assert len(traces) == count, name
        for t in traces:
            assert set(EVENT_COLUMNS) <= set(t.events.columns)
            assert list(t.comm.columns) == list(COMM_COLUMNS)
            ev = t.events
            assert (ev["end_ns"] >= ev["start_ns"]).all()
            assert (ev["dur_ns"] == ev["end_ns"] - ev["start_ns"]).all()
            assert ev["start_ns"].dtype == "int64"
            # epoch ns: between 2023 and 2030
            assert ev["start_ns"].min() > 1.67e18 and ev["end_ns"].max() < 1.9e18, name
            assert t.meta.backend == "nccl" and t.meta.rank_source == "distributedInfo"
            assert ev["main_thread"].any()


def test_ranks_from_distributed_info(loaded) -> None:
    assert [t.meta.rank for t in loaded["astrasim_megatron_tp8"][0]] == list(range(8))
    assert [t.meta.rank for t in loaded["hta_sampled_2of128"][0]] == [0, 1]
    warnings = loaded["hta_sampled_2of128"][1]
    assert any("126 of 128 ranks are missing (ranks 2-127)" in w for w in warnings)


def test_new_nccl_naming_and_bytes_from_input_dims(loaded) -> None:
    """megatron: ncclDevKernel_AllReduce_Sum_f16_RING_LL; bytes = [4, 2048, 4096] x f16."""
    for t in loaded["astrasim_megatron_tp8"][0]:
        k = _comm_kernels(t)
        assert len(k) == 84
        assert (k["comm_op"] == "all_reduce").all()
        # the CPU op's dtype (record_param_comms' Input type) wins over the kernel name's
        assert (k["comm_dtype"] == "c10::Half").sum() == 81
        assert (k["comm_dtype"] == "float").sum() == 3
        assert (k["comm_bytes"] == 4 * 2048 * 4096 * 2).sum() >= 70
        assert (k["step"] == 3).all()
        assert (k["pg_size"] == 8).all()


def test_old_nccl_naming_and_all_to_all_from_cpu_op(loaded) -> None:
    """DLRM: SendRecv kernels run the embedding all_to_all (c10d::alltoall_base_)."""
    for t in loaded["param_dlrm_ddp8"][0]:
        k = _comm_kernels(t)
        assert k["name"].astype(str).str.startswith("ncclKernel_").all()
        assert sorted(k["comm_op"].value_counts().items()) == [("all_reduce", 3), ("all_to_all", 5)]
        steps = t.steps
        assert steps["step"].tolist() == [10]
        assert 12.0 < (steps["end_ns"] - steps["start_ns"]).iloc[0] / 1e6 < 20.0
    kinds = loaded["param_dlrm_ddp8"][0][0].events["kind"].value_counts()
    assert kinds["dataloader"] == 1 and kinds["optimizer"] == 1 and kinds["step"] == 1


def test_rccl_generic_typed_from_collective_name(loaded) -> None:
    (t,) = loaded["tracelens_mi300_ddp"][0]
    k = _comm_kernels(t)
    assert len(k) == 17
    assert k["name"].astype(str).str.startswith("ncclDevKernel_Generic").all()
    typed = k["comm_op"].value_counts()
    assert typed["all_reduce"] == 6 and typed["broadcast"] == 6
    ar = k[k["comm_op"] == "all_reduce"]
    assert (ar["comm_dtype"] == "BFloat16").all() and (ar["comm_bytes"] > 1e6).all()
    assert t.steps["step"].tolist() == [15, 16, 17]


def test_non_nccl_comm_kernels_and_no_steps(loaded) -> None:
    (t,) = loaded["tracelens_b200_vllm"][0]
    k = _comm_kernels(t)
    multimem = k[k["name"].astype(str).str.contains("multimem_all_reduce_kernel")]
    assert len(multimem) == 73 and (multimem["comm_op"] == "all_reduce").all()
    gather = k[k["comm_op"] == "all_gather"]
    assert len(gather) == 1 and gather["pg_name"].iloc[0] == "3"
    assert t.steps.empty and (t.events["step"] == -1).all()


def test_full_comm_args_on_kernels(loaded) -> None:
    (t,) = loaded["hta_nccl_a100"][0]
    k = _comm_kernels(t)
    assert len(k) == 21 and k["comm_bytes"].notna().all()
    ar = k[k["comm_op"] == "all_reduce"]
    assert (ar["comm_dtype"] == "Float").all() and (ar["pg_size"] == 2).all()
    assert (ar["comm_bytes"] % 4 == 0).all()


@pytest.mark.parametrize(
    ("name", "op"),
    [
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "all_reduce",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "reduce_scatter",
        ),
        (
            "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "broadcast",
        ),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "send_recv",
        ),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),
        (
            "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)",
            "all_reduce",
        ),
        # issue 29: communication libraries with kernels of their own (names as DeepSeek's
        # public profile-data train.json and DeepEP's sources write them)
        ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*)", "all_to_all"),
        ("void dpsk::ep::internode::notify_dispatch<false, 4>(int const*, long*)", "all_to_all"),
        ("void dpsk::ep::internode::combine_ll<1>(void*)", "all_to_all"),
        ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*)", "all_to_all"),
        ("void deep_ep::internode_ll::dispatch<false, 7168>(void*)", "all_to_all"),
        ("void nvshmemi_transfer_rma_nbi_translate_kernel(void*)", None),
        ("void mscclpp::allreduce6<__half>(__half*)", "all_reduce"),
    ],
)
def test_classifier_every_kernel_naming(name: str, op: str | None) -> None:
    assert cls.classify_one(name, "kernel") == "comm"
    assert cls.kernel_comm_op(name) == op


def test_classifier_cpu_side_and_compute() -> None:
    assert cls.classify_one("void at::native::reduce_kernel<512, 1>", "kernel") == "compute"
    # DeepEP's layout computation and a CUB scan in a look-alike namespace are compute
    assert cls.classify_one("void dpsk::ep::cuda::get_dispatch_layout<256>(long*)", "kernel") == (
        "compute"
    )
    assert cls.classify_one("void cdpsk::ep::CUB_201::DeviceScanKernel<int>(int*)", "kernel") == (
        "compute"
    )
    # MTIA's device events: copies (dma*) and compute
    assert cls.canonical_category("mtia_ccp_events") == "kernel"
    assert cls.classify_one("dma_request", "kernel") == "memcpy"
    assert cls.classify_one("gloo:all_reduce", "user_annotation") == "comm"
    assert cls.classify_one("c10d::allreduce_", "cpu_op") == "comm_cpu"
    assert cls.classify_one("record_param_comms", "cpu_op") == "comm_cpu"
    assert cls.classify_one("nccl:all_to_all", "cpu_op") == "comm_cpu"
    assert cls.classify_one("ProfilerStep#3", "user_annotation") == "step"
    assert cls.classify_one("cudaStreamSynchronize", "cuda_runtime") == "sync"
    assert cls.classify_one("aten::item", "cpu_op") == "sync"
    assert cls.classify_one("cudaLaunchKernel", "cuda_runtime") == "runtime"
    name = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    assert cls.classify_one(name, "user_annotation") == "dataloader"
    assert cls.classify_one("Optimizer.step#SGD.step", "user_annotation") == "optimizer"
    for raw, op in [
        ("c10d::_allgather_base_", "all_gather"),
        ("allreduce", "all_reduce"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("nccl:_all_gather_base", "all_gather"),
        ("wait", None),
        ("c10d::barrier", "barrier"),
    ]:
        assert cls.normalise_op(raw) == op, raw


@pytest.mark.parametrize(
    ("file_name", "rank"),
    [
        ("rank3.pt.trace.json.gz", 3),
        ("rank-5.json.gz", 5),
        ("rank12_trace.json", 12),
        ("megatron_kineto_6.json", 6),
        ("worker2_step_12.1694128201554.pt.trace.json.gz", 2),
        ("host_1234.1694128201554.pt.trace.json", None),
        # issue 29: a job or process id, not rank 1016001
        ("libkineto_activities__1016001.json.gz", None),
        ("trace_65535.json", 65535),
    ],
)
def test_rank_from_file_name(file_name: str, rank: int | None) -> None:
    assert rank_from_name(Path(file_name)) == rank


def test_bare_number_above_the_world_size_is_no_rank() -> None:
    assert rank_from_name(Path("megatron_kineto_6.json"), world_size=8) == 6
    assert rank_from_name(Path("megatron_kineto_9.json"), world_size=8) is None
    assert rank_from_name(Path("rank9.json"), world_size=8) == 9  # said so: kept


def _write(path: Path, doc: dict, gz: bool) -> None:
    data = orjson.dumps(doc)
    path.write_bytes(gzip.compress(data, 1) if gz else data)


def test_foreign_layouts_without_distributed_info(shared_traces: Path, tmp_path: Path) -> None:
    """tensorboard_trace_handler / HTA / torchtitan names, gz or plain, no distributedInfo:
    ranks come from the file names; names without a rank get ranks by order."""
    sources = sorted((shared_traces / "hta_sampled_2of128").glob("*.json.gz"))
    docs = [orjson.loads(gzip.decompress(p.read_bytes())) for p in sources]
    for d in docs:
        d.pop("distributedInfo")
    layouts = {
        "titan": (["rank0_trace.json", "rank1_trace.json"], [False, False]),
        "hta": (["rank-1.json.gz", "rank-0.json.gz"], [True, True]),
        "tb/run1": (
            ["hostA_11.1694128201545.pt.trace.json.gz", "hostA_12.1694128201546.pt.trace.json"],
            [True, False],
        ),
    }
    for sub, (names, gz) in layouts.items():
        d = tmp_path / sub
        d.mkdir(parents=True)
        for doc, name, z in zip(docs, names, gz, strict=True):
            _write(d / name, doc, z)
    titan = load_traces(find_traces(tmp_path / "titan"), warnings=[])
    assert [(t.meta.rank, t.meta.rank_source) for t in titan] == [
        (0, "file name"),
        (1, "file name"),
    ]
    hta_warnings: list[str] = []
    hta = load_traces(find_traces(tmp_path / "hta"), warnings=hta_warnings)
    # rank-1.json.gz holds what was rank 0: the file name wins when distributedInfo is gone
    assert {t.meta.rank: len(t.events) for t in hta} == {
        1: len(titan[0].events),
        0: len(titan[1].events),
    }
    tb_warnings: list[str] = []
    tb = load_traces(find_traces(tmp_path / "tb"), warnings=tb_warnings)  # one level down
    assert [t.meta.rank_source for t in tb] == ["order", "order"]
    assert len(tb_warnings) == 2 and all("assumed rank" in w for w in tb_warnings)


def test_run_directory_layout(shared_traces: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "rank0").mkdir()
    for src, rank in zip(
        sorted((shared_traces / "param_dlrm_ddp8").glob("*.gz"))[:2], (0, 1), strict=True
    ):
        shutil.copy(src, run / "traces" / f"rank{rank}.pt.trace.json.gz")
    (run / "manifest.json").write_text("{}")
    found = find_traces(run)
    assert [p.name for p in found] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    warnings: list[str] = []
    traces = load_traces(found, warnings=warnings, workers=2)
    assert [t.meta.rank for t in traces] == [0, 1]
    assert any("6 of 8 ranks are missing (ranks 2-7)" in w for w in warnings)


def test_serial_and_parallel_give_the_same_tables(shared_traces: Path) -> None:
    paths = find_traces(shared_traces / "param_dlrm_ddp8")[:3]
    serial = load_traces(paths, warnings=[], workers=1)
    parallel = load_traces(paths, warnings=[], workers=2)
    for a, b in zip(serial, parallel, strict=True):
        pd.testing.assert_frame_equal(a.events, b.events)
        pd.testing.assert_frame_equal(a.steps, b.steps)


def test_single_file_load(shared_traces: Path) -> None:
    trace, warnings = load_trace(shared_traces / "hta_nccl_a100" / "nccl_data.json.gz")
    assert trace is not None and warnings == []
    assert trace.meta.world_size == 2 and trace.meta.pg_config[0]["pg_size"] == 2
    assert len(trace.meta.device_properties) == 8


def test_ids_beyond_int64_become_unknown(tmp_path: Path) -> None:
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 2, "pid": 0, "tid": 7}
    events = [
        # a u64 id (an int to orjson) and a float beyond int64; stream falls back to tid
        {**kernel, "args": {"stream": 10**30, "correlation": 1e30, "External id": 2**64 - 1}},
        {**kernel, "ts": 20, "args": {"stream": 7, "correlation": 5, "External id": "12"}},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))  # orjson refuses ints over 64 bits
    trace, warnings = load_trace(path)
    assert trace is not None and warnings == []
    ev = trace.events.sort_values("start_ns")
    assert list(ev["correlation"]) == [-1, 5]
    assert list(ev["external_id"]) == [-1, 12]
    assert list(ev["stream"]) == [7, 7]
