"""The call store (gpudiag/analysis/store.py): DuckDB holds at most its memory limit and
writes the rest to its own directory in TMPDIR, which is gone once the analysis is made."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis import analyze, comms, store
from gpudiag.analysis.store import CallStore
from gpudiag.paths import sample_runs_dir


def test_an_analysis_leaves_no_store_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    real = tempfile.mkdtemp

    def noted(*args: object, **kwargs: object) -> str:
        path = real(*args, **kwargs)  # type: ignore[call-overload]
        made.append(path)
        return path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(store.tempfile, "mkdtemp", noted)
    result = analyze(sample_runs_dir() / "ddp4_straggler")
    assert len(result.collective_summary)
    stores = [p for p in made if Path(p).name.startswith("gpudiag-store-")]
    assert stores and all(Path(p).parent == tmp_path for p in stores)
    assert not any(Path(p).exists() for p in stores)


def test_a_store_not_closed_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its directory goes when the store does (a start that failed, a caller's exception)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kept = CallStore()
    kept.add(pd.DataFrame({"rank": [0], "dur_ms": [1.0]}))
    assert [p.name[:14] for p in tmp_path.iterdir()] == ["gpudiag-store-"]
    del kept
    gc.collect()
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_summary_larger_than_the_memory_limit_is_pandas(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 M calls of one group, 120 MB of values for the medians' sorts alone, in a store of
    64 MB: its rows and sorts go to its directory past the limit (DuckDB stops at its limit
    where it cannot: 16 MB is too little here), and the summary is pandas' of the whole
    table."""
    monkeypatch.setattr(store, "MEMORY_LIMIT", "64MB")
    rng = np.random.default_rng(0)
    n = 3_000_000
    table = pd.DataFrame(
        {
            "rank": np.arange(n) % 4096,
            "pg_name": "0",
            "op": "all_reduce",
            "bytes": rng.choice([2.0**20, 2.0**22, 2.0**25], n),
            "dur_ms": rng.integers(1_000, 5_000_000, n) / 1e6,
            "busbw_gbs": rng.lognormal(3, 1, n),
            "peak_gbs": 300.0,
        }
    )
    with CallStore() as kept:
        for piece in np.array_split(np.arange(n), 46):
            kept.add(table.iloc[piece])
        limit = kept.query("SELECT current_setting('memory_limit') AS limit")["limit"].iloc[0]
        got = comms.collective_summary(kept).iloc[0]
    assert limit.endswith("MiB") and float(limit.split()[0]) < 64
    assert got["busbw_gbs_median"] == table["busbw_gbs"].median()
    assert got["bytes"] == table["bytes"].median()
    assert got["ranks"] == 4096 and got["count"] == n / 4096
