"""AnalysisResult's JSON is plain, stable and complete; the notebook API gives frames."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

import gpudiag
from gpudiag.analysis.result import BREAKDOWN_KEYS, plain

DOC = Path(__file__).resolve().parents[1] / "docs" / "json-schema.md"


def test_plain_maps_nan_numpy_and_frames():
    import numpy as np

    out = plain(
        {
            "a": np.float64("nan"),
            "b": np.int64(3),
            "c": [np.inf, 1.5],
            "d": pd.DataFrame({"x": [1.0, float("nan")]}),
            "e": Path("/x"),
        }
    )
    assert out == {"a": None, "b": 3, "c": [None, 1.5], "d": [{"x": 1.0}, {"x": None}], "e": "/x"}


def test_notebook_api_and_json_round_trip(shared_traces):
    res = gpudiag.analyze(shared_traces / "tracelens_mi300_ddp")
    assert isinstance(res.ranks, pd.DataFrame) and isinstance(res.breakdown, pd.DataFrame)
    assert list(res.ranks.columns[:5]) == [
        "rank",
        "steps",
        "step_ms_mean",
        "step_ms_median",
        "step_ms_p90",
    ]
    assert set(BREAKDOWN_KEYS) <= set(res.breakdown.columns)
    assert res.breakdown["step"].nunique() == 3  # ProfilerStep#15-#17
    text = json.dumps(res.to_json(), allow_nan=False)
    d = json.loads(text)
    for f in d["findings"]:
        assert math.isfinite(f["cost_ms_per_step"])
    # RCCL ncclDevKernel_Generic: typed from the comm args (allreduce / broadcast)
    assert {c["op"] for c in d["collectives"]} >= {"all_reduce"}


def test_every_top_level_key_is_documented(shared_traces):
    d = gpudiag.analyze(shared_traces / "tracelens_b200_vllm").to_json()
    doc = DOC.read_text()
    for key in d:
        assert f'"{key}"' in doc, key
    for key in d["run"]:
        assert f"`{key}`" in doc, key
    # no ProfilerStep in this inference trace: one window, no crash
    assert d["run"]["steps_analysed"] == 1
