"""Foreign GPU traces (recorded by others, ../shared/traces and tests/fixtures): the
analysis takes what the trace records over guesses, reads every Kineto vintage, and
says what it cannot see."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from gpudiag.analysis.breakdown import step_breakdown
from gpudiag.analysis.comms import collective_table
from gpudiag.analysis.ingest import find_traces, load_traces

FIXTURES = Path(__file__).parent / "fixtures"
KINETO_2021 = FIXTURES / "kineto_2021_v100"
# element sizes of the C++ type names the profiler writes in "Input type"
_SIZES = {"float": 4, "int": 4, "long int": 8, "c10::Half": 2}


def _raw_events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_all_to_all_bytes_from_the_cpu_op_not_the_int8_kernel(shared_traces: Path) -> None:
    """DLRM's all_to_all runs as ncclKernel_SendRecv_..._int8_t kernels; the bytes are the
    enclosing nccl:all_to_all op's elements x its dtype (float: 4, long int: 8), not x 1."""
    paths = find_traces(shared_traces / "param_dlrm_ddp8")
    table = collective_table(load_traces(paths, warnings=[]))
    for path in paths:
        expected = []
        for e in _raw_events(path):
            if e.get("name") == "nccl:all_to_all":
                args = e["args"]
                expected.append(math.prod(args["Input Dims"][0]) * _SIZES[args["Input type"][0]])
        rank = int(path.name.split("_")[0].removeprefix("worker"))
        rows = table[(table["rank"] == rank) & (table["op"] == "all_to_all")]
        assert len(rows) == len(expected) == 5
        assert sorted(rows["bytes"]) == sorted(expected)
        assert 24576 in expected  # 6144 floats: 4x what the kernel name's int8_t gave


def test_old_kineto_categories(tmp_path: Path) -> None:
    """A 2021 Kineto writes Kernel/Memcpy/Memset/Runtime/Operator: GPU copies are compute
    (not `other`), exactly as the same events under today's category names."""
    (trace,) = load_traces(find_traces(KINETO_2021), warnings=[])
    ev = trace.events
    copies = ev[ev["kind"].isin(["memcpy", "memset"])]
    assert len(copies) > 50 and copies["is_gpu"].all()
    assert set(ev["cat"].astype(str)) >= {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op"}
    renamed = {
        "Kernel": "kernel",
        "Memcpy": "gpu_memcpy",
        "Memset": "gpu_memset",
        "Runtime": "cuda_runtime",
        "Operator": "cpu_op",
    }
    doc = json.loads(gzip.decompress(next(KINETO_2021.iterdir()).read_bytes()))
    for e in doc["traceEvents"]:
        e["cat"] = renamed.get(e.get("cat"), e.get("cat"))
    new = tmp_path / "today.json"
    new.write_text(json.dumps(doc))
    (today,) = load_traces([new], warnings=[])
    old_b, new_b = step_breakdown(trace), step_breakdown(today)
    assert np.allclose(old_b.drop(columns="rank"), new_b.drop(columns="rank"))
    # the copies' own time, inside the steps, now counts as compute
    ws = trace.steps
    inside = copies[
        (copies["start_ns"] >= ws["start_ns"].min()) & (copies["end_ns"] <= ws["end_ns"].max())
    ]
    assert inside["dur_ns"].sum() / 1e6 / len(ws) > 1.0  # ms per step
